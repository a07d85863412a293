#!/usr/bin/env bash
# Build the kubelet bench (tests/kubelet_bench): our Go program that embeds the
# kubelet's real device manager, once per pinned Kubernetes release.
#
#   tools/build-kubelet-bench.sh              build what is missing or out of date
#   tools/build-kubelet-bench.sh --force      rebuild
#   tools/build-kubelet-bench.sh 1.29 1.37    only these releases (default: all)
#
# Output: build/kubelet-bench/kubelet-bench-<minor> (build/ is gitignored), e.g.
# build/kubelet-bench/kubelet-bench-1.37. tests/harness/kubelet.py finds them
# there, or in $KUBELET_BENCH_DIR.
#
# Each release has its own module file in tests/kubelet_bench (go1NN.mod plus
# go1NN.sum), selected with -modfile, and a build tag k8s1NN for the few API
# differences. A binary is rebuilt only when a Go source, its module files or
# this script is newer than it. A cold build (empty build cache) costs about
# 300 CPU-seconds per release: see tests/kubelet_bench/README.md.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
script="${repo_root}/tools/$(basename "${BASH_SOURCE[0]}")"
src_dir="${repo_root}/tests/kubelet_bench"
out_dir="${KUBELET_BENCH_DIR:-${repo_root}/build/kubelet-bench}"
all_versions=(1.29 1.35 1.37)
force=0
versions=()
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        1.[0-9][0-9]) versions+=("$arg") ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "build-kubelet-bench.sh: unknown argument '$arg' (expected --force or a release such as 1.37)" >&2; exit 2 ;;
    esac
done
[ ${#versions[@]} -eq 0 ] && versions=("${all_versions[@]}")

command -v go >/dev/null || { echo "build-kubelet-bench.sh: go not found on PATH" >&2; exit 1; }
mkdir -p "$out_dir"

# Every pinned release builds with the local Go (1.37 needs go >= 1.26; 1.29
# asks for go >= 1.21 and builds with 1.26); GOTOOLCHAIN can still be set from outside.
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
par="${KUBELET_BENCH_BUILD_PARALLEL:-$(nproc)}"

cd "$src_dir"
for v in "${versions[@]}"; do
    tag="k8s${v/./}"
    modfile="go${v/./}.mod"
    sumfile="go${v/./}.sum"
    [ -f "$modfile" ] || { echo "build-kubelet-bench.sh: no ${modfile} for release ${v}" >&2; exit 2; }
    bin="${out_dir}/kubelet-bench-${v}"
    if [ "$force" -eq 0 ] && [ -x "$bin" ]; then
        newer="$(find . "$script" -maxdepth 1 \( -name '*.go' -o -name "$modfile" -o -name "$sumfile" -o -path "$script" \) -newer "$bin" -print -quit)"
        if [ -z "$newer" ]; then
            echo "build-kubelet-bench.sh: ${bin#"$repo_root"/} is up to date"
            continue
        fi
    fi
    echo "build-kubelet-bench.sh: building ${v} (-modfile=${modfile} -tags ${tag}, -p ${par}) -> ${bin#"$repo_root"/}"
    start=$(date +%s)
    go build -p "$par" -modfile="$modfile" -tags "$tag" -trimpath -ldflags "-s -w" -o "${bin}.tmp" .
    mv -f "${bin}.tmp" "$bin"
    echo "build-kubelet-bench.sh: built in $(( $(date +%s) - start ))s: $("$bin" version)"
done
