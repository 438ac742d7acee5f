#!/usr/bin/env bash
# A short fault-injection run with a fixed seed, as CI runs it: real `txoutbox relay`
# processes against their own PostgreSQL cluster and NATS server (started in a temp dir, on
# free ports, removed afterwards), with every fault kind. Exits non-zero if an invariant broke.
#   scripts/chaos.sh                              # 60 s, seed 42, debug build
#   CHAOS_PROFILE=release scripts/chaos.sh --duration 10m --seed 7
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
exec "$bin/txoutbox-chaos" --pg-bin "$pg_bin" --nats-server "$nats" \
  --duration 60s --seed 42 --relays 3 --faults all --fault-interval 4s "$@"
