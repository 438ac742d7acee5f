#!/usr/bin/env bash
# The dependency policy in deny.toml, checked by cargo-deny: licences, crates banned or kept to
# one version (one reqwest in the daemon), and sources (crates.io only). Installs cargo-deny at
# the pinned version when it is missing or another version. Exits non-zero on a violation.
#
#   scripts/deny.sh                  # licenses bans sources, the CI check
#   scripts/deny.sh bans             # one check
#   scripts/deny.sh advisories       # needs the advisory database: not reachable from CI
#
# Security advisories are not in the default run: see the top of deny.toml.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.20.2
export PATH="$HOME/.cargo/bin:$PATH"
if [ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $VERSION" ]; then
  echo "deny: installing cargo-deny $VERSION with cargo" >&2
  # cargo-deny has no optional features to leave out. Its release profile asks for fat LTO in
  # one codegen unit: the same CPU time here (3.6 vs 3.8 CPU minutes), but its last and
  # largest crate then compiles on one core. Cargo's usual release settings let it use both.
  CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
    cargo install --locked "cargo-deny@$VERSION"
fi
[ $# -gt 0 ] || set -- licenses bans sources
# --workspace: every member is a root, not only the default member (the daemon). Only errors
# are printed, each with the path that brings the crate in; the counts of warnings (the
# duplicates deny.toml tolerates, about 2,000 lines of trees) are in the summary:
# DENY_LOG_LEVEL=warn prints them.
exec cargo deny --workspace --locked --log-level "${DENY_LOG_LEVEL:-error}" \
  check --show-stats "$@"
