# Sourced by the measuring scripts (drain.sh, drain-db.sh, wake-db.sh, drain-otel.sh,
# claim-bench/run.sh, pg-limits.sh, write-cost.sh, lease-hot.sh, bench-compare.sh,
# ceiling-ratio.sh): with BENCH_OUT=FILE set, the script's output also goes to
# FILE (docs/bench/*.txt), after a header saying how, when and where it was measured: the exact
# command, the date (UTC), nproc, the PostgreSQL and MySQL/MariaDB server versions and the git
# commit. Without BENCH_OUT nothing changes: the script prints its figures and writes no file.
# Call as: bench_record "$0" "$@" before any output and before the script's own cd (a relative
# BENCH_OUT is taken from the caller's directory).
bench_record() {
  [ -n "${BENCH_OUT:-}" ] || return 0
  local root cmd pg my commit dirty client var out given=$BENCH_OUT
  out=$(realpath -m "$BENCH_OUT")
  # Not for the scripts this one calls (drain-otel.sh runs drain.sh): one file per command.
  unset BENCH_OUT
  root=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel 2>/dev/null || echo .)
  cmd=$(printf '%q ' "$@"); cmd=${cmd% }
  # The settings the scripts read from the environment, as a prefix of the command.
  for var in ROUNDS RELAYS CLIENTS MODES PG_LIMITS TXOUTBOX_BIN DATABASE_URL MYSQL_URL SKIP_A SKIP_B N; do
    [ -z "${!var:-}" ] || cmd="$var=$(printf '%q' "${!var}") $cmd"
  done
  # A password in a URL (user:password@) never goes into a file meant to be committed.
  cmd=$(printf '%s' "$cmd" | sed -E 's#(://[^:/@[:space:]]*):[^@/[:space:]]*@#\1:***@#g')
  local pgurl=postgres://postgres@127.0.0.1:5432/test
  case ${DATABASE_URL:-} in postgres://* | postgresql://*) pgurl=$DATABASE_URL ;; esac
  pg=$(psql -qAtX "$pgurl" -c 'SHOW server_version' 2>/dev/null || echo unknown)
  my=unknown
  if client=$(command -v mariadb || command -v mysql); then
    local base=${MYSQL_URL:-mysql://root@127.0.0.1:3306/test} hp
    hp=${base#*@}; hp=${hp%%/*}
    my=$("$client" -h "${hp%%:*}" -P "${hp##*:}" -u root -N -e 'SELECT VERSION()' 2>/dev/null || echo unknown)
  fi
  commit=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  dirty=$(git -C "$root" status --porcelain --untracked-files=no -- . \
    ':!docs/bench' ':!docs/bench.*' 2>/dev/null | head -1)
  [ -z "$dirty" ] || commit="$commit (with uncommitted changes)"
  mkdir -p "$(dirname "$out")"
  {
    echo "# command: $cmd"
    echo "# date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# nproc:   $(nproc)"
    echo "# postgresql: $pg"
    echo "# mysql:   $my"
    echo "# commit:  $commit"
    echo "# written by the command above (BENCH_OUT=$given); run it again to replace this file"
    echo
  } > "$out"
  # Everything the script prints from here on (stdout and stderr) goes to the file too.
  exec > >(tee -a "$out") 2>&1
}
