#!/usr/bin/env bash
# Install what building txoutbox needs besides the Rust toolchain and a C compiler: pkg-config
# and OpenSSL's headers (libssl-dev), with which the bundled librdkafka is built with TLS
# (kafkas://). From Debian packages, only when they are missing. Safe to run again.
set -euo pipefail

log() { echo "build-deps: $*" >&2; }
missing=()
command -v pkg-config >/dev/null || missing+=(pkg-config)
if ! { command -v pkg-config >/dev/null && pkg-config --exists openssl; } \
  && ! dpkg -s libssl-dev >/dev/null 2>&1; then
  missing+=(libssl-dev)
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  log "need root to install ${missing[*]} (or install them yourself)"
  exit 1
fi
log "installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null
