#!/usr/bin/env bash
# Wake-up latency of an idle relay on MySQL/MariaDB or SQLite for a writer in ANOTHER process
# (no in-process wake-up: adaptive polling only). The release relay idles on a fresh database
# with the given options; K single-row inserts arrive 0.5–2.5 s apart (autocommit, from the
# `mariadb` client or python's sqlite3), and the latency of each is processed_at - created_at,
# both taken from the database clock (insert to settle).
#   scripts/wake-db.sh mysql 20 --poll-interval 1s
# BENCH_OUT=docs/bench/FILE also writes the result to FILE, with a header (scripts/bench-record.sh).
set -euo pipefail
. "$(dirname "$0")/bench-record.sh"
bench_record "$0" "$@"
cd "$(dirname "$0")/.."
usage="usage: scripts/wake-db.sh sqlite|mysql K [relay options]"
kind=${1:?$usage}
k=${2:?$usage}
shift 2
bin=${TXOUTBOX_BIN:-${CARGO_TARGET_DIR:-target}/release/txoutbox}
export TXOUTBOX_LOG=warn TXOUTBOX_ADMIN_ADDR=off
unset TXOUTBOX_SCHEMA TXOUTBOX_TABLE
ins="INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '1', 'order.created', '{\"n\": 1}')"
stats="SELECT count(*), min(processed_at - created_at), avg(processed_at - created_at), max(processed_at - created_at) FROM outbox_events WHERE processed_at IS NOT NULL"
case $kind in
  sqlite)
    dir=$(mktemp -d)
    export DATABASE_URL="sqlite://$dir/wake.db"
    sql() { python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1], timeout=10); r=c.execute(sys.argv[2]).fetchall(); c.commit(); print(*(' '.join(map(str, x)) for x in r), sep='\n')" "$dir/wake.db" "$1"; }
    cleanup() { rm -rf "$dir"; }
    ;;
  mysql)
    base=${MYSQL_URL:-mysql://root@127.0.0.1:3306/test}
    name=txo_wake_$$
    export DATABASE_URL="${base%/*}/$name"
    client=$(command -v mariadb || command -v mysql)
    hostport=${base#*@}; hostport=${hostport%%/*}
    root() { "$client" -h "${hostport%%:*}" -P "${hostport##*:}" -u root -N -e "$1"; }
    sql() { "$client" -h "${hostport%%:*}" -P "${hostport##*:}" -u root -N -D "$name" -e "$1"; }
    root "CREATE DATABASE $name"
    cleanup() { root "DROP DATABASE IF EXISTS $name" >/dev/null 2>&1; }
    ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
relay=
# Wait for the relay only: a bare `wait` would also wait for BENCH_OUT's tee, which ends only
# when this script does.
trap '[ -n "$relay" ] && kill "$relay" 2>/dev/null && wait "$relay" 2>/dev/null; cleanup' EXIT
"$bin" migrate >/dev/null
"$bin" relay --publisher null: "$@" &
relay=$!
sleep 3
for _ in $(seq 1 "$k"); do
  sql "$ins" >/dev/null
  sleep "$(python3 -c 'import random; print(round(random.uniform(0.5, 2.5), 3))')"
done
sleep 2
read -r count lo avg hi <<<"$(sql "$stats")"
echo "$kind: $count of $k inserts from another process published; insert to settle: min ${lo} ms, avg ${avg} ms, max ${hi} ms (relay options: ${*:-defaults})"
