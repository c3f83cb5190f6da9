#!/usr/bin/env bash
# Packages every publishable crate of the workspace, as `cargo publish` would
# upload it: the crates are found with `cargo metadata` (every member without
# `publish = false`), put in dependency order, and packaged together, so that a
# crate's dependencies on its unpublished siblings resolve to their packages
# here. `--no-verify`: the packages are not built again from their tarballs
# (the test suite builds the same sources). The .crate files land in
# target/package.
#
#   scripts/package.sh            # package them all
#   scripts/package.sh --list     # only print the crates, in order
set -euo pipefail
cd "$(dirname "$0")/.."

# Publishable members, each after the members it depends on (normal and build
# dependencies; dev-dependencies are left out of the order, as cargo does).
mapfile -t crates < <(
  cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
meta = json.load(sys.stdin)
members = set(meta["workspace_members"])
packages = {p["name"]: p for p in meta["packages"] if p["id"] in members}
publishable = {n for n, p in packages.items() if p["publish"] != []}
deps = {
    n: sorted(d["name"] for d in packages[n]["dependencies"]
              if d["name"] in packages and d["kind"] != "dev")
    for n in publishable
}
for n in publishable:
    unpublished = [d for d in deps[n] if d not in publishable]
    if unpublished:
        sys.exit(f"{n} depends on {unpublished}, which are publish = false")
order, done = [], set()
def visit(n, path=()):
    if n in done:
        return
    if n in path:
        sys.exit("dependency cycle: " + " -> ".join(path + (n,)))
    for d in deps[n]:
        visit(d, path + (n,))
    done.add(n)
    order.append(n)
for n in sorted(publishable):
    visit(n)
print("\n".join(order))
'
)

if [ "${1:-}" = "--list" ]; then
  printf '%s\n' "${crates[@]}"
  exit 0
fi

echo "[package] ${#crates[@]} crates: ${crates[*]}" >&2
args=()
for crate in "${crates[@]}"; do
  args+=(--package "$crate")
done
# --allow-dirty: the steps before this one in scripts/test.sh may leave files
# in the work tree.
cargo package --no-verify --allow-dirty "${args[@]}"
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
for crate in "${crates[@]}"; do
  ls -s --block-size=K "$target_dir/package/$crate"-[0-9]*.crate | sed 's/^/[package] /' >&2
done
