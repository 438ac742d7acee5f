#!/usr/bin/env bash
# The WAL source's decoders fuzzed for a long while: their property tests (the `props`
# modules under crates/txoutbox/src/store/postgres/wal/: pgoutput messages, outbox rows,
# message sequences, LSNs, the stream's framing, CopyData, ErrorResponse and SCRAM messages,
# as arbitrary and as mutated valid bytes) run round after round, FUZZ_CASES cases a property
# each round and a fresh seed each round, until DURATION has passed. Stops at the first
# failure and prints it (proptest's smallest failing input) with the command that runs that
# round again; proptest also saves the case in crates/txoutbox/proptest-regressions/, which
# every later run of the tests tries first (commit it with the fix). Needs nothing running.
#   scripts/fuzz-decoders.sh              # an hour
#   scripts/fuzz-decoders.sh 5m           # DURATION: seconds, or a number with s, m or h
#   FUZZ_CASES=100000 scripts/fuzz-decoders.sh 8h
# A debug build, so that an integer overflow panics as in the tests; proptest's XorShift
# generator rather than its default ChaCha, which took most of a case's time in a debug
# build. A round is not cut short: the run ends after the round that crosses DURATION (about
# 25 s a round with the default 20000 cases on a 2-core machine). CI runs the same tests
# short, 256 cases each, in `cargo test` (both tiers).
set -euo pipefail
cd "$(dirname "$0")/.."

duration=${1:-1h}
case "$duration" in
  *h) seconds=$((${duration%h} * 3600)) ;;
  *m) seconds=$((${duration%m} * 60)) ;;
  *s) seconds=${duration%s} ;;
  *) seconds=$duration ;;
esac
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
  echo "usage: $0 [DURATION]   e.g. 90s, 5m, 8h (default 1h)" >&2
  exit 2
fi
cases=${FUZZ_CASES:-20000}
test=(cargo test -q -p txoutbox --no-default-features --features wal --lib)
filter=::props::

"${test[@]}" --no-run
export PROPTEST_RNG_ALGORITHM=xs
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
end=$((start + seconds))
rounds=0
total=0
while [ "$(date +%s)" -lt "$end" ]; do
  seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
  rounds=$((rounds + 1))
  if ! PROPTEST_CASES=$cases PROPTEST_RNG_SEED=$seed "${test[@]}" "$filter" >"$log" 2>&1; then
    # The failing tests' own output: what panicked or which assertion, and the smallest input.
    sed -n '/^failures:$/,/^failures:$/p' "$log" | grep -v '^   [0-9]*: \|^             at ' || cat "$log"
    grep '^test result' "$log" || true
    echo "fuzz-decoders: round $rounds failed after $total cases in earlier rounds; again with:" >&2
    echo "  PROPTEST_RNG_ALGORITHM=xs PROPTEST_CASES=$cases PROPTEST_RNG_SEED=$seed ${test[*]} $filter" >&2
    exit 1
  fi
  passed=$(sed -n 's/^test result: ok\. \([0-9]*\) passed.*/\1/p' "$log")
  passed=${passed:-0}
  total=$((total + passed * cases))
  echo "round $rounds: seed $seed, $passed properties x $cases cases passed ($(($(date +%s) - start)) s)"
done
echo "fuzz-decoders: $total cases in $rounds rounds, $(($(date +%s) - start)) s, no failure"
