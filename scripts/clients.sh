#!/usr/bin/env bash
# A Python environment with the official clients the tests read txoutbox's messages with
# (the CloudEvents SDK's Kafka binding, confluent-kafka), pinned in scripts/clients/requirements.txt,
# in target/clients-venv. Prints the interpreter's path. Safe to run again: it reinstalls only
# when the requirements changed.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/clients-venv
req=scripts/clients/requirements.txt
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$req" "$venv/requirements.txt"; then
  echo "clients: installing $(grep -v '^#' "$req" | tr '\n' ' ')into $venv" >&2
  rm -rf "$venv"
  mkdir -p target
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2
  cp "$req" "$venv/requirements.txt"
fi
echo "$PWD/$venv/bin/python"
