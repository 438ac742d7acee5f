#!/usr/bin/env bash
# Check what deploy/ ships, offline once its tools are installed (CI runs it):
# - every Kubernetes manifest under deploy/kubernetes/ against the Kubernetes API's schemas of
#   1.25 and 1.37, strictly (an unknown field is an error), with kubernetes-validate, which
#   bundles them;
# - what no schema sees (scripts/deploy-check/consistency.py): the kustomizations' resources
#   exist, selectors, Secret keys, ports and probes fit together, one source per form, a WAL
#   standby, the image's user and port, the ServiceMonitor (a CRD: no bundled schema);
# - deploy/systemd/txoutbox.service with `systemd-analyze verify` (any line it prints fails the
#   check: it reports unknown keys and bad values as warnings only) and its sandbox with
#   `systemd-analyze security --offline` (exposure at most 2.0 of 10).
#   scripts/deploy-check.sh
# The validator goes into a virtual environment, $TXOUTBOX_DEPLOY_VENV (default
# /opt/txoutbox-deploy-check, kept between clones), made again only when
# scripts/deploy-check/requirements.txt changed; systemd-analyze is installed from Debian's
# packages when missing. The Dockerfile is checked by building it: scripts/image-test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "deploy-check: $*" >&2; }
venv=${TXOUTBOX_DEPLOY_VENV:-/opt/txoutbox-deploy-check}
req=scripts/deploy-check/requirements.txt
if [ ! -x "$venv/bin/kubernetes-validate" ] || ! cmp -s "$req" "$venv/requirements.txt"; then
  log "installing $(grep -v '^#' "$req" | tr '\n' ' ')into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2
  cp "$req" "$venv/requirements.txt"
fi
if ! command -v systemd-analyze >/dev/null; then
  if [ "$(id -u)" != 0 ]; then log "need root to install systemd (systemd-analyze)"; exit 1; fi
  log "installing systemd (for systemd-analyze)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
fi

# --- Kubernetes ------------------------------------------------------------------------------
# Every manifest but the kustomizations and the ServiceMonitor, which have no schema here.
mapfile -t manifests < <(find deploy/kubernetes -name '*.yaml' ! -name kustomization.yaml \
  ! -name servicemonitor.yaml | sort)
[ ${#manifests[@]} -gt 0 ] || { log "no manifest under deploy/kubernetes"; exit 1; }
# The oldest Kubernetes whose schemas it bundles, and the newest.
for version in 1.25.0 1.37.0; do
  "$venv/bin/kubernetes-validate" --strict --quiet -k "$version" "${manifests[@]}"
done
log "${#manifests[@]} manifests valid against Kubernetes 1.25 and 1.37 (kubernetes-validate --strict)"
"$venv/bin/python" scripts/deploy-check/consistency.py .

# --- systemd ---------------------------------------------------------------------------------
unit=deploy/systemd/txoutbox.service
exec_start=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$unit")
[ "$exec_start" = /usr/local/bin/txoutbox ] \
  || { log "$unit starts $exec_start, not /usr/local/bin/txoutbox (where docs/operations.md installs it)"; exit 1; }
# verify wants the command to exist: the same unit, with that path pointing at an executable
# of this machine (the binary may not be built; verify checks the path only).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s#^ExecStart=/usr/local/bin/txoutbox#ExecStart=$(command -v true)#" "$unit" >"$tmp/txoutbox.service"
said=$(systemd-analyze verify "$tmp/txoutbox.service" 2>&1) || { echo "$said" >&2; exit 1; }
[ -z "$said" ] || { log "systemd-analyze verify $unit:"; echo "$said" >&2; exit 1; }
exposure=$(systemd-analyze security --offline=true --threshold=20 "$tmp/txoutbox.service" 2>&1 | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p') \
  || { log "systemd-analyze security: $unit's exposure is ${exposure:-unknown}, above 2.0"; exit 1; }
log "$unit: verify clean, exposure $exposure (systemd $(systemd-analyze --version | awk 'NR==1{print $2}'))"
