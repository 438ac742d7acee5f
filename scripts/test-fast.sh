#!/usr/bin/env bash
# The fast tier: the library's tests that need no service, in a few seconds once built. Its
# unit tests (pure logic: durations, filters, templates, URLs, backoff, the SQL files, the
# pgoutput decoder, ...) and its SQLite tests (the store conformance suite on SQLite, the byte
# columns, a relay end to end), each SQLite test in a file of its own in the temporary
# directory. Nothing is started or installed; no database or broker is reached.
#   scripts/test-fast.sh            # before a commit; scripts/test.sh is the full tier
# Extra arguments go to both `cargo test` runs (e.g. --release). The features are named, not
# taken from the crate's defaults, so the command means the same whatever the defaults are.
# The store and relay test binaries need the postgres and mysql features to build (they hold
# those databases' tests too); the filter `sqlite` runs only the SQLite ones, so a test whose
# name says sqlite must not need a server.
set -euo pipefail
cd "$(dirname "$0")/.."
# The store and relay binaries need the WAL source's feature too.
features=testing,postgres,wal,sqlite,mysql
cargo test -p txoutbox --no-default-features --features "$features" "$@" --lib
cargo test -p txoutbox --no-default-features --features "$features" "$@" \
  --test store --test relay -- sqlite
