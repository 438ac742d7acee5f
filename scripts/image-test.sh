#!/usr/bin/env bash
# The container image of deploy/Dockerfile, built and run on a Debian machine without a Docker
# engine, and an event delivered through it. Not in CI: it needs a release build of the daemon
# with every broker (the longest build there is) and downloads Debian packages.
#   scripts/image-test.sh            # as root; PostgreSQL and Redis on loopback (started if down)
#
# 1. The base image: `debian:bookworm-slim` and `rust:1-slim-bookworm` cannot be pulled here (no
#    container registry is reachable), so a bookworm root filesystem made by debootstrap
#    (--variant=minbase, what the slim image is made of) becomes the local base image, kept
#    for the next run.
# 2. The binary as the Dockerfile's build stage makes it: the same `cargo build` command, then
#    the stage's `objcopy` lines, read from the Dockerfile and run as written (on /out moved).
# 3. The Dockerfile's runtime stage, built by buildah (chroot isolation, vfs storage, its own
#    storage under $work) with step 2's output in place of the build stage
#    (--build-context build=DIR): the stage's packages, user, environment, health check,
#    entrypoint as written.
# 4. The image run as a container runtime would: its root filesystem (buildah mount), its
#    user (10001, no capability, no supplementary group), its entrypoint and environment read
#    from the image's config, secrets mounted read-only as files under /run/secrets and passed
#    with *_FILE variables, the host's network. (`podman run` cannot start a container here:
#    crun's setrlimit(RLIMIT_NOFILE/NPROC) is refused without CAP_SYS_RESOURCE.)
#    It runs the README's third quick-start command (`demo`, SQLite in the container), then
#    `migrate`, `enqueue`, `relay` to a Redis stream until the event is there, with the
#    image's HEALTHCHECK command and /readyz answering, stops it with SIGTERM (exit 0), then
#    the CronJob form, `relay --drain` to stdout, for a second event.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$(date +%s)
log() { echo "image-test: [$(($(date +%s) - start)) s] $*" >&2; }
if [ "$(id -u)" != 0 ]; then
  log "needs root (debootstrap, buildah, chroot)"
  exit 1
fi
work=${TXOUTBOX_IMAGE_TEST_DIR:-/var/tmp/txoutbox-image-test}
mkdir -p "$work"
need=()
command -v buildah >/dev/null || need+=(buildah)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v setpriv >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
scripts/build-deps.sh
scripts/services.sh
bah() { buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs "$@"; }

# --- 1. the base image -------------------------------------------------------------------
base=localhost/txoutbox-test-bookworm
if ! bah inspect --type image "$base" >/dev/null 2>&1; then
  log "debootstrap bookworm (minbase) as $base"
  rm -rf "$work/rootfs"
  debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  # As the official slim image is made: no package cache or lists, apt keeps no downloaded
  # package, and dpkg installs no documentation, manual or translation.
  rm -rf "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/var/cache/apt/"*.bin \
    "$work/rootfs/var/cache/apt/archives/"*.deb
  cat >"$work/rootfs/etc/apt/apt.conf.d/docker-clean" <<'APT'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT
  cat >"$work/rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
DPKG
  find "$work/rootfs/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete
  rm -rf "$work/rootfs/usr/share/info/"* "$work/rootfs/usr/share/locale/"* "$work/rootfs/usr/share/man/"*
  ctr=$(bah from scratch)
  mnt=$(bah mount "$ctr")
  tar -C "$work/rootfs" -c . | tar -C "$mnt" -x
  bah umount "$ctr" >/dev/null
  # What the official image's config says beyond its files.
  bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd bash "$ctr"
  bah commit --quiet "$ctr" "$base" >/dev/null
  bah rm "$ctr" >/dev/null
  rm -rf "$work/rootfs"
fi

# --- 2. the binary, as the build stage makes it --------------------------------------------
target=${CARGO_TARGET_DIR:-$root/target}
log "cargo build --release --locked -p txoutbox-cli"
cargo build --release --locked -p txoutbox-cli
out=$work/build/out
rm -rf "$work/build"
mkdir -p "$out"
cp "$target/release/txoutbox" "$out/txoutbox"
strip_cmd=$(sed -n '/^RUN objcopy/,/^$/p' deploy/Dockerfile | sed -e 's/^RUN //' -e 's/\\$//' | tr -d '\n')
[ -n "$strip_cmd" ] || { log "no RUN objcopy step found in deploy/Dockerfile"; exit 1; }
bash -euc "${strip_cmd//\/out\//$out/}"
log "binary: $(stat -c %s "$target/release/txoutbox") bytes as built, $(stat -c %s "$out/txoutbox") in the image, $(stat -c %s "$out/txoutbox.debug") of debug info beside it"

# --- 3. the runtime stage ------------------------------------------------------------------
image=localhost/txoutbox:image-test
log "buildah bud --target runtime -f deploy/Dockerfile"
bah bud --quiet --isolation chroot --format docker --pull=never \
  --build-arg RUNTIME_IMAGE="$base" --build-context build="$work/build" \
  --target runtime -f deploy/Dockerfile -t "$image" . >/dev/null

# --- 4. run it -----------------------------------------------------------------------------
ctr=$(bah from --pull=never "$image")
mnt=$(bah mount "$ctr")
schema=image_test_$(date +%s)_$$
stream=txoutbox-image-test-$schema
relay_pid=
cleanup() {
  [ -n "$relay_pid" ] && kill -KILL "$relay_pid" 2>/dev/null
  psql -q -h 127.0.0.1 -U postgres test -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
  redis-cli -h 127.0.0.1 DEL "$stream" >/dev/null 2>&1 || true
  bah umount "$ctr" >/dev/null 2>&1 || true
  bah rm "$ctr" >/dev/null 2>&1 || true
}
trap cleanup EXIT
cfg() { bah inspect --type image --format "$1" "$image"; }
user=$(cfg '{{.OCIv1.Config.User}}')
entrypoint=$(cfg '{{range .OCIv1.Config.Entrypoint}}{{.}} {{end}}')
mapfile -t image_env < <(cfg '{{range .OCIv1.Config.Env}}{{println .}}{{end}}' | sed '/^$/d')
[ "$user" = 10001:10001 ] || { log "the image's user is '$user', not 10001:10001"; exit 1; }
# Secrets as a runtime mounts them: read-only files the container's user can read.
secrets=$work/secrets
rm -rf "$secrets"
mkdir -p "$secrets"
echo "postgres://postgres@127.0.0.1:5432/test" >"$secrets/database_url"
echo "redis://127.0.0.1:6379?stream=$stream" >"$secrets/publisher"
head -c 24 /dev/urandom | base64 >"$secrets/admin_token"
chown -R 10001:10001 "$secrets"
chmod 0400 "$secrets"/*
port=18720
env_for_run=("${image_env[@]}" DATABASE_URL_FILE=/run/secrets/database_url
  TXOUTBOX_PUBLISHER_FILE=/run/secrets/publisher TXOUTBOX_ADMIN_TOKEN_FILE=/run/secrets/admin_token
  TXOUTBOX_SCHEMA="$schema" TXOUTBOX_ADMIN_ADDR="0.0.0.0:$port")
# One container process: a mount namespace of its own (/proc, /dev, the secrets), the image's
# root, its user without capabilities, its environment only, its entrypoint. Every step execs
# (call it in a subshell), so the PID is the daemon's and signals reach it. Arguments: the
# environment (NAME=VALUE...) and the command.
in_image() {
  exec unshare --mount -- bash -euc '
    mnt=$1 secrets=$2 user=$3; shift 3
    mount -t proc proc "$mnt/proc"
    mount --rbind /dev "$mnt/dev"
    mkdir -p "$mnt/run/secrets"
    mount --bind -o ro "$secrets" "$mnt/run/secrets"
    exec chroot "$mnt" setpriv --reuid "${user%%:*}" --regid "${user##*:}" --clear-groups \
      --inh-caps=-all --bounding-set=-all --no-new-privs env -i "$@"' \
    _ "$mnt" "$secrets" "$user" "$@"
}
run() { (in_image "${env_for_run[@]}" $entrypoint "$@"); }

# The README's third quick-start command: what its `docker run` runs, in the image, with the
# image's environment alone.
readme=$(scripts/quickstart.sh | sed -n 3p)
prefix="docker build -f deploy/Dockerfile -t txoutbox . && docker run --rm txoutbox "
[ "${readme#"$prefix"}" != "$readme" ] \
  || { log "the README's third quick-start command is not \`$prefix...\`: $readme"; exit 1; }
log "the README's image command: txoutbox ${readme#"$prefix"}"
(in_image "${image_env[@]}" $entrypoint ${readme#"$prefix"}) >"$work/readme.out" 2>"$work/readme.log" \
  || { log "it failed:"; cat "$work/readme.log" >&2; exit 1; }
log "it passed ($(wc -l <"$work/readme.out") lines on stdout)"

log "migrate, enqueue (the image's user and entrypoint, secrets from files)"
run migrate
id1=$(cat /proc/sys/kernel/random/uuid)
run enqueue --aggregate-type order --aggregate-id 1 --event-type order.created \
  --payload '{"via":"image"}' --id "$id1"

log "relay to the Redis stream $stream"
(in_image "${env_for_run[@]}" $entrypoint relay) >"$work/relay.log" 2>&1 &
relay_pid=$!
deadline=$((SECONDS + 60))
until redis-cli -h 127.0.0.1 XRANGE "$stream" - + 2>/dev/null | grep -q "$id1"; do
  if ! kill -0 "$relay_pid" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
    log "the event did not reach the stream; the relay's log:"
    cat "$work/relay.log" >&2
    exit 1
  fi
  sleep 0.2
done
log "event $id1 delivered to $stream"
health=$(cfg '{{range .Docker.Config.Healthcheck.Test}}{{println .}}{{end}}' | sed '/^$/d')
mapfile -t health_cmd < <(echo "$health")
[ "${health_cmd[0]}" = CMD ] || { log "unexpected HEALTHCHECK: $health"; exit 1; }
(in_image "${env_for_run[@]}" "${health_cmd[@]:1}") || { log "the image's HEALTHCHECK failed"; exit 1; }
log "HEALTHCHECK (${health_cmd[*]:1:2} ...) passed"
ready=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz")
[ "$ready" = 200 ] || { log "/readyz answered $ready"; exit 1; }
log "/readyz 200"
kill -TERM "$relay_pid"
status=0
wait "$relay_pid" || status=$?
relay_pid=
[ "$status" = 0 ] || { log "relay exited $status after SIGTERM"; cat "$work/relay.log" >&2; exit 1; }
# Stopped: the health check fails now (it is no stub).
if (in_image "${env_for_run[@]}" "${health_cmd[@]:1}") 2>/dev/null; then
  log "the HEALTHCHECK passed with no relay running"
  exit 1
fi
log "relay exited 0 after SIGTERM; the HEALTHCHECK fails without it"

log "relay --drain --publisher stdout: (the CronJob form)"
id2=$(cat /proc/sys/kernel/random/uuid)
run enqueue --aggregate-type order --aggregate-id 2 --event-type order.created \
  --payload '{"via":"image","n":2}' --id "$id2"
# The publisher from the command line this time (the file's conflicts with it), no listener.
mapfile -t env_for_run < <(printf '%s\n' "${env_for_run[@]}" | grep -v '^TXOUTBOX_PUBLISHER_FILE=')
env_for_run+=(TXOUTBOX_ADMIN_ADDR=off)
drained=$(run relay --drain --publisher stdout: 2>"$work/drain.log")
grep -q "$id2" <<<"$drained" || { log "--drain printed no $id2"; cat "$work/drain.log" >&2; exit 1; }
log "event $id2 drained to stdout"
log "passed in $(($(date +%s) - start)) s"
