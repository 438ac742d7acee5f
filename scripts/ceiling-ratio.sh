#!/usr/bin/env bash
# The table relay against PostgreSQL's own ceiling, paired round by round. Each round measures
# the ceiling (the reference's set-based bigint UPDATE: 200,000 rows claimed and marked 1,000 a
# statement by one client, bench/pg-limits/b1_big_update.sql beside this repository, as
# scripts/pg-limits.sh runs it) and right after it one drain per mode of the working tree's
# relay (`txoutbox-bench drain --repeats 1`, to `null:`), and divides each drain by the ceiling
# of its own round. The ceiling moves by a fifth between sittings on a shared machine, and a
# drain set against one measured minutes away moves with it; pairing takes most of that out.
#   scripts/ceiling-ratio.sh                  # 5 rounds, ordered and unordered
#   scripts/ceiling-ratio.sh 7 --events 200000
#   BENCH_OUT=docs/bench/ceiling-ratio.txt scripts/ceiling-ratio.sh 7
# Arguments after ROUNDS go to every drain (the modes are this script's: MODES=ordered to run
# one). Needs target/release/txoutbox and txoutbox-bench (cargo build --release -p txoutbox-cli
# -p txoutbox-bench --all-features), pgbench and psql, and PostgreSQL at DATABASE_URL. The
# ceiling's table lives in a database of its own (txo_ceiling), dropped at the end. About 40 s
# a round on 2 cores. Without the reference it says so and skips, as pg-limits.sh does.
# BENCH_OUT=docs/bench/FILE also writes the result to FILE, with a header (scripts/bench-record.sh).
set -euo pipefail
. "$(dirname "$0")/bench-record.sh"
bench_record "$0" "$@"
cd "$(dirname "$0")/.."
ref=$(dirname "${PG_LIMITS:-../shared/bench/pg-limits/run.sh}")
if [ ! -f "$ref/b1_big_update.sql" ]; then
  echo "ceiling-ratio: $ref/b1_big_update.sql not found: skipped (set PG_LIMITS to the reference run.sh)" >&2
  exit 0
fi
rounds=${1:-5}
case $rounds in '' | *[!0-9]* | 0)
  echo "usage: scripts/ceiling-ratio.sh [ROUNDS (a positive number)] [txoutbox-bench drain arguments]" >&2
  exit 2 ;;
esac
[ $# -eq 0 ] || shift
modes=${MODES:-ordered unordered}
for bin in target/release/txoutbox target/release/txoutbox-bench; do
  [ -x "$bin" ] || { echo "ceiling-ratio: $bin not built (cargo build --release -p txoutbox-cli -p txoutbox-bench --all-features)" >&2; exit 2; }
done
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
export DATABASE_URL=$url
db=txo_ceiling
# The ceiling's database on the same server as the drains: the URL with its database swapped.
base=${url%%\?*}; query=${url#"$base"}
ceiling_url="${base%/*}/$db$query"
PGOPTIONS="-c client_min_messages=warning" psql -qAtX "$url" -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
work=$(mktemp -d -t ceiling-ratio.XXXXXX)
trap 'rm -rf "$work"; psql -qAtX "$url" -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT
PGOPTIONS="-c client_min_messages=warning" psql -qX -v ON_ERROR_STOP=1 "$ceiling_url" -f "$ref/schema_b.sql" > /dev/null

# rows/s of one run of the reference's bigint UPDATE, on a fresh fill.
ceiling() {
  psql -qX -v ON_ERROR_STOP=1 -v tbl=ob_big -v n=200000 "$ceiling_url" -f "$ref/b_fill.sql" > /dev/null
  pgbench -n -M prepared -c 1 -j 1 -t 200 -f "$ref/b1_big_update.sql" "$ceiling_url" 2>&1 |
    awk '/^tps = / { printf "%.0f\n", $3 * 1000 }'
}

# events/s of one drain in mode $1.
drain() {
  target/release/txoutbox-bench drain --txoutbox-bin target/release/txoutbox --publisher null: \
    --repeats 1 --mode "$1" --json-file "$work/drain.json" "${@:2}" > "$work/drain.log" 2>&1 || {
    cat "$work/drain.log" >&2; return 1; }
  python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))["sections"][0]["rows"][0]
print(round(r["metrics"]["events_per_s"]["median"]))' "$work/drain.json"
}

printf '%-6s %10s' round ceiling
for m in $modes; do printf ' %12s %7s' "$m" ratio; done
echo
for r in $(seq "$rounds"); do
  c=$(ceiling)
  [ -n "$c" ] || { echo "ceiling-ratio: pgbench gave no rate" >&2; exit 1; }
  printf '%-6s %10s' "$r" "$c"
  for m in $modes; do
    d=$(drain "$m" "$@")
    printf ' %12s %7s' "$d" "$(python3 -c "print(f'{$d / $c:.3f}')")"
    echo "$m $d $c" >> "$work/pairs"
  done
  echo
done
python3 - "$work/pairs" <<'EOF'
import statistics, sys
pairs = {}
for line in open(sys.argv[1]):
    mode, d, c = line.split()
    pairs.setdefault(mode, []).append((int(d), int(c)))
print()
for mode, ps in pairs.items():
    ratios = sorted(d / c for d, c in ps)
    print(f"{mode}: drain / ceiling of its round, median {statistics.median(ratios):.3f} "
          f"(min {ratios[0]:.3f}, max {ratios[-1]:.3f}) over {len(ratios)} rounds; drains "
          f"median {statistics.median(d for d, _ in ps):,.0f} events/s, ceilings median "
          f"{statistics.median(c for _, c in ps):,.0f} rows/s")
EOF
