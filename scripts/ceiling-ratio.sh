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
# one; they take turns at running first after the ceiling). Needs target/release/txoutbox and
# txoutbox-bench (cargo build --release -p txoutbox-cli -p txoutbox-bench --all-features),
# pgbench, psql and python3, and PostgreSQL at DATABASE_URL (a postgres:// URL). The ceiling's
# table lives in a database of its own on that server (txo_ceiling), dropped at the end. About
# 10 s a round on 2 cores. Without the reference it says so and skips, as pg-limits.sh does.
# BENCH_OUT=docs/bench/FILE also writes the result to FILE, with a header (scripts/bench-record.sh).
set -euo pipefail
. "$(dirname "$0")/bench-record.sh"
usage="usage: scripts/ceiling-ratio.sh [ROUNDS (a positive number, default 5)] [txoutbox-bench drain arguments]"
case ${1:-} in -h | --help) echo "$usage"; exit 0 ;; esac
rounds=${1:-5}
case $rounds in *[!0-9]* | '') echo "$usage" >&2; exit 2 ;; esac
[ "$rounds" -gt 0 ] || { echo "$usage" >&2; exit 2; }
# Every check before bench_record: a run that cannot measure must not rewrite BENCH_OUT.
root=$(cd "$(dirname "$0")/.." && pwd)
ref=$(dirname "${PG_LIMITS:-$root/../shared/bench/pg-limits/run.sh}")
if [ ! -f "$ref/b1_big_update.sql" ]; then
  echo "ceiling-ratio: $ref/b1_big_update.sql not found: skipped (set PG_LIMITS to the reference run.sh)" >&2
  exit 0
fi
for bin in "$root/target/release/txoutbox" "$root/target/release/txoutbox-bench"; do
  [ -x "$bin" ] || { echo "ceiling-ratio: $bin not built (cargo build --release -p txoutbox-cli -p txoutbox-bench --all-features)" >&2; exit 2; }
done
for tool in pgbench psql python3; do
  command -v "$tool" > /dev/null || { echo "ceiling-ratio: needs $tool" >&2; exit 2; }
done
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
db=txo_ceiling
# The ceiling's database on the same server as the drains: the URL with its database swapped.
ceiling_url=$(python3 -c 'import sys, urllib.parse as u
p = u.urlsplit(sys.argv[1])
if p.scheme not in ("postgres", "postgresql") or not p.hostname:
    sys.exit("ceiling-ratio: DATABASE_URL must be a postgres:// URL with a host")
print(u.urlunsplit(p._replace(path="/" + sys.argv[2])))' "$url" "$db")
bench_record "$0" "$@"
cd "$root"
[ $# -eq 0 ] || shift
modes=(${MODES:-ordered unordered})
export DATABASE_URL=$url
PGOPTIONS="-c client_min_messages=warning" psql -qAtX "$url" -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
work=$(mktemp -d -t ceiling-ratio.XXXXXX)
trap 'rm -rf "$work"; psql -qAtX "$url" -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT
PGOPTIONS="-c client_min_messages=warning" psql -qX -v ON_ERROR_STOP=1 "$ceiling_url" -f "$ref/schema_b.sql" > /dev/null

# rows/s of one run of the reference's bigint UPDATE, on a fresh fill.
ceiling() {
  psql -qX -v ON_ERROR_STOP=1 -v tbl=ob_big -v n=200000 "$ceiling_url" -f "$ref/b_fill.sql" > /dev/null
  pgbench -n -M prepared -c 1 -j 1 -t 200 -f "$ref/b1_big_update.sql" "$ceiling_url" \
    > "$work/pgbench.log" 2>&1 || { cat "$work/pgbench.log" >&2; return 1; }
  awk '/^tps = / { printf "%.0f\n", $3 * 1000 }' "$work/pgbench.log"
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
for m in "${modes[@]}"; do printf ' %12s %7s' "$m" ratio; done
echo
for r in $(seq "$rounds"); do
  c=$(ceiling)
  [ -n "$c" ] || { echo "ceiling-ratio: pgbench gave no rate (see its output above)" >&2; exit 1; }
  # The modes take turns at running first after the ceiling, round by round.
  order=("${modes[@]}")
  if [ $((r % 2)) -eq 0 ]; then
    order=(); for ((i = ${#modes[@]} - 1; i >= 0; i--)); do order+=("${modes[i]}"); done
  fi
  declare -A got=()
  for m in "${order[@]}"; do
    got[$m]=$(drain "$m" "$@")
    echo "$m ${got[$m]} $c" >> "$work/pairs"
  done
  printf '%-6s %10s' "$r" "$c"
  for m in "${modes[@]}"; do
    printf ' %12s %7s' "${got[$m]}" "$(python3 -c "print(f'{${got[$m]} / $c:.3f}')")"
  done
  echo
  unset got
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
