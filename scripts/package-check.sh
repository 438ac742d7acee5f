#!/usr/bin/env bash
# Checks that the published crates are what `cargo add` users should get, and that the
# declared rust-version is true:
# - `cargo package --list` of txoutbox and txoutbox-cli holds their README and licence texts,
#   no file over 256 KiB and nothing private (keys, certificates, env files, build output);
# - both crates package (metadata complete, no path-only dependency), without the verify
#   build (the test run builds the same code);
# - the workspace's rust-version is the highest any package in Cargo.lock's resolve declares
#   (so it is neither lower than a dependency needs nor higher than necessary).
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "package-check: $*" >&2; exit 1; }
for crate in txoutbox txoutbox-cli; do
  list=$(cargo package -p "$crate" --list --allow-dirty --quiet)
  for need in Cargo.toml README.md LICENSE-MIT LICENSE-APACHE src/lib.rs; do
    [ "$need" = src/lib.rs ] && [ "$crate" = txoutbox-cli ] && need=src/main.rs
    grep -qx "$need" <<<"$list" || fail "$crate: the package lacks $need"
  done
  if bad=$(grep -E '(^|/)(target/|\.env|.*\.(pem|key|p12|pfx|crt|db|sqlite)$)' <<<"$list"); then
    fail "$crate: private or generated files in the package: $bad"
  fi
  dir=crates/$crate
  while read -r f; do
    case "$f" in Cargo.toml.orig|Cargo.lock|.cargo_vcs_info.json) continue ;; esac
    [ -e "$dir/$f" ] || continue
    size=$(stat -L -c %s "$dir/$f")
    [ "$size" -le 262144 ] || fail "$crate: $f is $size bytes (over 256 KiB)"
  done <<<"$list"
  echo "package-check: $crate: $(wc -l <<<"$list") files" >&2
done
cargo package -p txoutbox -p txoutbox-cli --no-verify --allow-dirty --quiet
declared=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print({p["rust_version"] for p in json.load(sys.stdin)["packages"]}.pop())')
needed=$(cargo metadata --format-version 1 --all-features --locked --filter-platform "$(rustc -vV | sed -n "s/^host: //p")" | python3 -c '
import json, sys
m = json.load(sys.stdin)
used = {n["id"] for n in m["resolve"]["nodes"]}
ws = set(m["workspace_members"])
best = (0, 0, 0), "none", "none"
for p in m["packages"]:
    if p["id"] in used and p["id"] not in ws and p.get("rust_version"):
        v = tuple(int(x) for x in (p["rust_version"].split(".") + ["0", "0"])[:3])
        if v > best[0]:
            best = v, p["rust_version"], p["name"] + " " + p["version"]
print(best[1], best[2])')
read -r need_v need_by <<<"$needed"
norm() { awk -F. '{printf "%d.%d.%d", $1, $2, ($3 == "" ? 0 : $3)}' <<<"$1"; }
[ "$(norm "$declared")" = "$(norm "$need_v")" ] \
  || fail "rust-version is $declared but the highest any dependency declares is $need_v ($need_by)"
echo "package-check: rust-version $declared (the highest dependency's: $need_by)" >&2
