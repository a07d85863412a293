#!/usr/bin/env bash
# Build the Go peer of the DRA bench, kubernetes-sigs/dra-example-driver's kubelet plugin
# (cmd/dra-example-kubeletplugin), from a source tree given on the command line:
#
#   tools/build-dra-example-driver.sh SRC [OUT]
#
# SRC is a checkout (a directory holding its go.mod) or a git directory (a bare clone
# or mirror, whose HEAD is built). The Go module proxy does not serve this module, so
# its source must come from elsewhere; nothing of it is kept in this repository or
# fetched by this script, which only reads SRC. Its Go dependencies come from the
# module proxy (or the module cache). OUT defaults to
# build/peers/dra-example-kubeletplugin (and OUT.source: the revision built); run the bench with
# `python -m bench run --benches dra --dra-example-driver OUT`.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="${1:?usage: tools/build-dra-example-driver.sh SRC [OUT]}"
out="${2:-${repo_root}/build/peers/dra-example-kubeletplugin}"
command -v go >/dev/null || { echo "build-dra-example-driver.sh: go not found on PATH" >&2; exit 1; }

tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
if [ -f "$src/go.mod" ]; then
    cp -a "$src/." "$tree/"
    revision="$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)"
elif git --git-dir="$src" rev-parse --verify -q HEAD >/dev/null; then
    git --git-dir="$src" archive --format=tar HEAD | tar -x -C "$tree"
    revision="$(git --git-dir="$src" rev-parse HEAD)"
else
    echo "build-dra-example-driver.sh: $src is neither a source tree (go.mod) nor a git directory" >&2
    exit 2
fi
grep -q '^module sigs.k8s.io/dra-example-driver$' "$tree/go.mod" \
    || { echo "build-dra-example-driver.sh: $src is not sigs.k8s.io/dra-example-driver" >&2; exit 2; }

export GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
mkdir -p "$(dirname "$out")"
echo "build-dra-example-driver.sh: building ${revision} -> ${out}"
cd "$tree"
TIMEFORMAT="build-dra-example-driver.sh: built in %R s wall, %U s user + %S s system CPU"
time go build -p "${DRA_EXAMPLE_BUILD_PARALLEL:-$(nproc)}" -trimpath \
    -ldflags "-s -w" -o "${out}.tmp" ./cmd/dra-example-kubeletplugin
mv -f "${out}.tmp" "$out"
# The bench reports where the binary came from (bench/machine.py reads this file).
echo "sigs.k8s.io/dra-example-driver ${revision}" >"${out}.source"
