#!/usr/bin/env bash
# Build the real node-feature-discovery (nfd-master and nfd-worker) that tests/e2e runs
# beside a cluster to turn the daemon's feature file (--nfd-features-dir) into Node labels
# (tests/e2e/test_nfd_labels.py), from the Go module proxy, pinned by the Go module in
# tools/nfd.
#
#   tools/build-nfd.sh          build when missing or out of date
#   tools/build-nfd.sh --force  rebuild
#
# Output: build/bin/nfd-master and build/bin/nfd-worker (build/ is gitignored); the tests
# find them there, or through $NFD_BIN_DIR. The CRDs the test applies are read from the
# module's deployment/ directory in the module cache (`go list -m -f '{{.Dir}}'`), which
# this build fills.
#
# The shared Go module and build caches (those of tools/build-helm.sh and
# tools/build-kube-state-metrics.sh). nfd-master imports k8s.io/kubernetes v1.34, so its
# k8s.io/* stay at v0.34 (tools/nfd/go.mod's replaces, as upstream's go.mod has them) and
# are not shared with helm's v0.37. Measured on 2 cores with -p 1, an e2e cluster running
# beside it: from empty module and build caches 117 s (downloads included; 411 MB of
# modules, 956 MB of build cache); with the modules already there, 95 s. Flags as
# upstream's Makefile: CGO off, -trimpath, stripped, the version stamped.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out_dir="${repo_root}/build/bin"
force=0
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "build-nfd.sh: unknown argument '$arg' (expected --force)" >&2; exit 2 ;;
    esac
done

command -v go >/dev/null || { echo "build-nfd.sh: go not found on PATH" >&2; exit 1; }
mkdir -p "$out_dir"

# As tools/build-helm.sh: the local toolchain, only the module proxy, one core left free.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
par="${NFD_BUILD_PARALLEL:-$(( $(nproc) > 1 ? $(nproc) - 1 : 1 ))}"

mod_dir="${repo_root}/tools/nfd"
cd "$mod_dir"
up_to_date=1
for cmd in nfd-master nfd-worker; do
    bin="${out_dir}/${cmd}"
    if [ "$force" -eq 1 ] || [ ! -x "$bin" ] || [ ! "$bin" -nt "${mod_dir}/go.mod" ] || [ ! "$bin" -nt "${mod_dir}/go.sum" ]; then
        up_to_date=0
    fi
done
if [ "$up_to_date" -eq 1 ]; then
    echo "build-nfd.sh: build/bin/nfd-master and nfd-worker are up to date"
    exit 0
fi
module="sigs.k8s.io/node-feature-discovery"
version="$(go list -m -f '{{.Version}}' "$module")"
ldflags="-s -w -X ${module}/pkg/version.version=${version}"
echo "build-nfd.sh: building ${module} ${version} nfd-master nfd-worker -> build/bin (-p ${par})"
start=$(date +%s)
for cmd in nfd-master nfd-worker; do
    bin="${out_dir}/${cmd}"
    go build -p "$par" -trimpath -ldflags "$ldflags" -o "${bin}.tmp" "${module}/cmd/${cmd}"
    mv -f "${bin}.tmp" "$bin"
done
echo "build-nfd.sh: nfd-master and nfd-worker built in $(( $(date +%s) - start ))s: $("${out_dir}/nfd-worker" -version 2>&1 | head -1)"
