#!/usr/bin/env bash
# Install the tools the tests need besides the services: headless Chromium and its WebDriver
# (the dashboard's browser test), promtool (the alert rules check and the /metrics
# exposition), groff (the man pages render) and python3's venv (the official clients of
# scripts/clients.sh), from Debian packages,
# only when they are missing. Safe to run again.
set -euo pipefail

log() { echo "tools: $*" >&2; }
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
command -v promtool >/dev/null || missing+=(prometheus)
command -v groff >/dev/null || missing+=(groff-base)
# python3's venv, for the official clients of scripts/clients.sh.
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  log "need root to install ${missing[*]}"
  exit 1
fi
log "installing ${missing[*]}"
apt-get update -qq
# fonts-liberation: readable text in the dashboard screenshot without the recommends.
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" fonts-liberation >/dev/null
