#!/usr/bin/env bash
# Drain rate of the release relay on MySQL/MariaDB or SQLite (scripts/drain.sh does the same
# on PostgreSQL): N events inserted set-based into a fresh database (MySQL: a database of its
# own on MYSQL_URL's server; SQLite: a file in a temp directory), then `txoutbox relay --drain`
# to PUBLISHER, timed from start to exit. Extra arguments go to the relay.
#   scripts/drain-db.sh sqlite 100000 null:
#   scripts/drain-db.sh mysql 100000 'nats://127.0.0.1:4222?stream=DRAIN&subject=drain.{aggregate_type}.{event_type}'
# Needs a release build (cargo build --release), python3, and for MySQL the `mariadb` (or
# `mysql`) client and the services of scripts/services.sh.
# BENCH_OUT=docs/bench/FILE also writes the result to FILE, with a header (scripts/bench-record.sh).
set -euo pipefail
. "$(dirname "$0")/bench-record.sh"
bench_record "$0" "$@"
cd "$(dirname "$0")/.."
usage="usage: scripts/drain-db.sh sqlite|mysql N PUBLISHER [relay options]"
kind=${1:?$usage}
n=${2:?$usage}
publisher=${3:?$usage}
shift 3
bin=${TXOUTBOX_BIN:-${CARGO_TARGET_DIR:-target}/release/txoutbox}
export TXOUTBOX_LOG=warn TXOUTBOX_ADMIN_ADDR=off
unset TXOUTBOX_SCHEMA TXOUTBOX_TABLE
case $kind in
  sqlite)
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    export DATABASE_URL="sqlite://$dir/drain.db"
    "$bin" migrate >/dev/null
    python3 - "$dir/drain.db" "$n" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("""WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?)
  INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
  SELECT 'order', CAST(n % 1000 AS TEXT), 'order.created',
         json_object('order_id', n, 'customer_id', 'c-' || (n % 97), 'total', n * 1.5,
                     'note', printf('%.100c', 'x'))
  FROM g""", (int(sys.argv[2]),))
c.commit()
PY
    left() { python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT count(*) FROM outbox_events WHERE processed_at IS NULL').fetchone()[0])" "$dir/drain.db"; }
    ;;
  mysql)
    base=${MYSQL_URL:-mysql://root@127.0.0.1:3306/test}
    name=txo_drain_$$
    export DATABASE_URL="${base%/*}/$name"
    client=$(command -v mariadb || command -v mysql)
    hostport=${base#*@}; hostport=${hostport%%/*}
    sql() { "$client" -h "${hostport%%:*}" -P "${hostport##*:}" -u root -N -e "$1"; }
    sql "CREATE DATABASE $name"
    trap 'sql "DROP DATABASE IF EXISTS $name" >/dev/null 2>&1' EXIT
    "$bin" migrate >/dev/null
    # Numbers 1..N from cross joins of digits (portable across MySQL and MariaDB).
    sql "INSERT INTO $name.outbox_events (aggregate_type, aggregate_id, event_type, payload)
      SELECT 'order', CAST(g % 1000 AS CHAR), 'order.created',
             JSON_OBJECT('order_id', g, 'customer_id', CONCAT('c-', g % 97), 'total', g * 1.5, 'note', REPEAT('x', 100))
      FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * d.d + 10000 * e.d + 100000 * f.d + 1 AS g
            FROM (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) a,
                 (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) b,
                 (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) c,
                 (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) d,
                 (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) e,
                 (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) f) nums
      WHERE g <= $n ORDER BY g"
    sql "ANALYZE TABLE $name.outbox_events" >/dev/null
    left() { sql "SELECT count(*) FROM $name.outbox_events WHERE processed_at IS NULL"; }
    ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
start=$(date +%s.%N)
"$bin" relay --publisher "$publisher" --drain "$@"
end=$(date +%s.%N)
done_n=$((n - $(left)))
python3 -c "import sys; n,s,e,d=int(sys.argv[1]),float(sys.argv[2]),float(sys.argv[3]),int(sys.argv[4]); print(f'{sys.argv[5]}: drained {d} of {n} events in {e-s:.2f} s: {d/(e-s):,.0f} events/s')" "$n" "$start" "$end" "$done_n" "$kind"
