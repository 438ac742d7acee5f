#!/usr/bin/env bash
# The regression gate: the working tree's relay against another commit's, interleaved in one
# sitting, with each row's ratio to the other build (`txoutbox-bench --baseline-bin`). Every
# change to the hot path quotes its output.
#   scripts/bench-compare.sh main~1                       # drain to null:, ordered, 3 rounds
#   scripts/bench-compare.sh v0.1.0 --mode unordered      # extra arguments go to txoutbox-bench
#   scripts/bench-compare.sh 78ab07f scale --relays 1,2   # a scenario first: drain or scale
# The other commit is built in target/baseline/worktree with a target directory of its own
# (target/baseline/target; a cargo target shared between two trees would mix their builds), once
# per commit: the binary is kept as target/baseline/txoutbox-<commit>. Each run's schema is
# migrated by the binary that runs it, so an older build runs on the schema it knows.
# Needs the services of scripts/services.sh (PostgreSQL; NATS for a nats:// publisher).
# BENCH_OUT=docs/bench/FILE also writes the result to FILE, with a header (scripts/bench-record.sh).
set -euo pipefail
. "$(dirname "$0")/bench-record.sh"
bench_record "$0" "$@"
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: scripts/bench-compare.sh REV [drain|scale] [txoutbox-bench arguments]" >&2
  exit 2
fi
rev=$1; shift
scenario=drain
case "${1:-}" in drain|scale) scenario=$1; shift ;; esac
commit=$(git rev-parse --verify --quiet "$rev^{commit}") || {
  echo "bench-compare: $rev is not a commit of this repository" >&2; exit 2; }
short=$(git rev-parse --short=10 "$commit")
target="${CARGO_TARGET_DIR:-target}"
base_dir="$target/baseline"
baseline="$base_dir/txoutbox-$short"
mkdir -p "$base_dir"
if [ ! -x "$baseline" ]; then
  tree="$base_dir/worktree"
  git worktree remove --force "$tree" >/dev/null 2>&1 || rm -rf "$tree"
  git worktree prune
  git worktree add --quiet --detach "$tree" "$commit"
  echo "bench-compare: building $short in $tree" >&2
  (cd "$tree" && CARGO_TARGET_DIR="$PWD/../target" cargo build -q --release -p txoutbox-cli --bin txoutbox)
  cp "$base_dir/target/release/txoutbox" "$baseline"
  git worktree remove --force "$tree"
fi
cargo build -q --release -p txoutbox-cli --bin txoutbox
cargo build -q --release -p txoutbox-bench
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
export TXOUTBOX_LOG=${TXOUTBOX_LOG:-warn}
echo "baseline: $rev ($short); this build: the working tree"
# null: (the database side alone) unless a publisher is given.
publisher=(--publisher null:)
for a in "$@"; do case "$a" in --publisher|--publisher=*) publisher=() ;; esac; done
"$target/release/txoutbox-bench" "$scenario" --baseline-bin "$baseline" \
  --txoutbox-bin "$target/release/txoutbox" "${publisher[@]}" "$@"
