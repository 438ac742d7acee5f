#!/usr/bin/env bash
# Print (no argument) or run (`scripts/quickstart.sh N`) the README's quick-start command
# number N, exactly as the README has it: the lines of the first ```sh block under
# "## Quick start", comments stripped. CI runs command 1 with this, so the README's first
# command is tested as a newcomer types it.
set -euo pipefail
cd "$(dirname "$0")/.."
commands=$(awk '
  /^## Quick start/ { in_section = 1; next }
  in_section && /^## / { exit }
  in_section && /^```sh/ { in_block = 1; next }
  in_block && /^```/ { exit }
  in_block { sub(/[[:space:]]+#.*$/, ""); if (length($0)) print }
' README.md)
if [ -z "$commands" ]; then
  echo "quickstart: no \`\`\`sh block under '## Quick start' in README.md" >&2
  exit 1
fi
if [ $# -eq 0 ]; then
  printf '%s\n' "$commands"
  exit 0
fi
line=$(printf '%s\n' "$commands" | sed -n "${1}p")
if [ -z "$line" ]; then
  echo "quickstart: README's quick start has no command $1" >&2
  exit 1
fi
echo "quickstart: running README's command $1: $line" >&2
bash -euo pipefail -c "$line"
