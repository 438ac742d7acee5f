#!/usr/bin/env bash
# Checks that the published crates are what `cargo add` users should get, and that the
# declared rust-version is true:
# - `cargo package --list` of txoutbox and txoutbox-cli holds their README and licence texts,
#   no file over 256 KiB and nothing private (keys, certificates, env files, build output);
# - both crates package (metadata complete, no path-only dependency), without the verify
#   build (the test run builds the same code);
# - the workspace's rust-version is not below what any dependency of the published crates
#   declares (clippy's incompatible_msrv lint keeps our own code within it).
# - `cargo add txoutbox` with its default features builds no C code.
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
# `cargo add txoutbox` with its default features (none) builds no C code: no build script in
# its tree compiles C (cc, cmake) or looks for a system library (pkg-config).
if c=$(cargo tree -p txoutbox -e normal,build --prefix none --format '{p}' \
    | grep -E '^(cc|cmake|pkg-config) ' | sort -u | tr '\n' ' '); [ -n "$c" ]; then
  fail "txoutbox with default features builds C code (through: $c); see cargo tree -p txoutbox -i <crate>"
fi
echo "package-check: txoutbox with default features builds no C code" >&2
# rust-version: one value for the workspace, not below what any normal or build dependency of
# the published crates declares (clippy's incompatible_msrv lint, run with -D warnings, keeps
# our own code within it).
declared=$(cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
vs = {p["rust_version"] for p in json.load(sys.stdin)["packages"]}
if len(vs) != 1:
    sys.exit(f"package-check: the workspace crates declare different rust-versions: {sorted(map(str, vs))}")
print(vs.pop())')
meta=$(mktemp); trap 'rm -f "$meta"' EXIT
cargo metadata --format-version 1 --all-features --locked \
  --filter-platform "$(rustc -vV | sed -n "s/^host: //p")" >"$meta"
python3 - "$declared" "$meta" <<'PY'
import json, sys
declared, meta = sys.argv[1], sys.argv[2]
m = json.load(open(meta))
pk = {p["id"]: p for p in m["packages"]}
nodes = {n["id"]: n for n in m["resolve"]["nodes"]}
def ver(v):
    return tuple(int(x) for x in (v.split(".") + ["0", "0"])[:3])
# Walk normal and build edges from the published crates (not dev-dependencies, not chaos).
todo = [i for i, p in pk.items() if p["name"] in ("txoutbox", "txoutbox-cli") and i in nodes]
seen = set()
while todo:
    i = todo.pop()
    if i in seen:
        continue
    seen.add(i)
    for d in nodes[i]["deps"]:
        if any(k["kind"] in (None, "build") for k in d["dep_kinds"]):
            todo.append(d["pkg"])
ws = set(m["workspace_members"])
need = max((pk[i] for i in seen - ws if pk[i].get("rust_version")),
           key=lambda p: ver(p["rust_version"]))
what = f'{need["name"]} {need["version"]} declares {need["rust_version"]}'
if ver(declared) < ver(need["rust_version"]):
    sys.exit(f"package-check: rust-version is {declared}, but {what}")
print(f"package-check: rust-version {declared}; the highest among the published crates' dependencies: {what}", file=sys.stderr)
PY
