#!/bin/sh
# The patches in this directory, measured: copies of hyper 1.12.0, h2 0.4.20 and h3 0.0.8 are
# taken from cargo's registry, patched, and put under the workspace with `[patch.crates-io]`
# in a worktree of its own (this checkout is not touched); then `bench --instructions` counts
# each client over HTTP/1.1, h2c and HTTP/3 against the patched crates. Compare with the same
# commands run in this checkout (unpatched). Needs valgrind, like `bench --instructions`.
#
#   docs/upstream/measure.sh            # from the workspace root
#   KEEP=1 docs/upstream/measure.sh     # keep the worktree and its target for another run
set -eu

root=$(git rev-parse --show-toplevel)
work=${UPSTREAM_WORK:-${TMPDIR:-/tmp}/soulbase-upstream}
tree="$work/tree"
target=${UPSTREAM_TARGET:-$work/target}
registry=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/ | head -n 1)

cleanup() {
    if [ -z "${KEEP:-}" ]; then
        git -C "$root" worktree remove --force "$tree" 2>/dev/null || true
        rm -rf "$work"
    fi
}
trap cleanup EXIT INT TERM

rm -rf "$tree" "$work/crates"
mkdir -p "$work/crates"
git -C "$root" worktree add --detach "$tree" HEAD >/dev/null
# The crates are in the registry once the workspace has been built (cargo fetch puts them there).
(cd "$root" && cargo fetch -q)
for pair in hyper-1.12.0:hyper-h2-connection-headers h2-0.4.20:h2-check-headers h3-0.0.8:h3-qpack-huffman; do
    crate=${pair%%:*}
    cp -r "$registry/$crate" "$work/crates/$crate"
    patch -s -p1 -d "$work/crates/$crate" < "$root/docs/upstream/${pair#*:}.patch"
done
cat >> "$tree/Cargo.toml" <<TOML

[patch.crates-io]
hyper = { path = "$work/crates/hyper-1.12.0" }
h2 = { path = "$work/crates/h2-0.4.20" }
h3 = { path = "$work/crates/h3-0.0.8" }
TOML
cd "$tree"
CARGO_TARGET_DIR="$target" cargo build -q --release -p xtask
# Against a scratch copy of the budget: the patched figures are reported, never written back.
cp docs/bench-budget.json "$work/budget.json"
for protocol in "" --h2c --h3; do
    "$target/release/xtask" bench --instructions $protocol --budget "$work/budget.json" || true
done
