#!/usr/bin/env bash
# Build the kubelet bench (tests/kubelet_bench): our Go program that embeds the
# kubelet's real device manager, once per pinned Kubernetes release.
#
#   tools/build-kubelet-bench.sh              build what is missing or out of date
#   tools/build-kubelet-bench.sh --force      rebuild
#   tools/build-kubelet-bench.sh 1.29 1.37    only these releases (default: all)
#   tools/build-kubelet-bench.sh --quick 1.37 what `make demo` builds: any up-to-date
#                                             binary will do, else one built without the
#                                             compiler's optimizations (see below)
#   tools/build-kubelet-bench.sh --list       print the releases it would build, build nothing
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
#
# --quick compiles without optimizations, inlining or DWARF (-gcflags=all=-N -l
# -dwarf=false) and with the compiler's GOGC at 400: a third less CPU cold, a slower
# binary. The benches measure the kubelet's CPU, so only the demo takes such a build:
# without --quick a quick binary counts as out of date (bench/ refuses one).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
script="${repo_root}/tools/$(basename "${BASH_SOURCE[0]}")"
src_dir="${repo_root}/tests/kubelet_bench"
out_dir="${KUBELET_BENCH_DIR:-${repo_root}/build/kubelet-bench}"
all_versions=(1.29 1.35 1.37)
force=0
quick=0
list=0
versions=()
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        --quick) quick=1 ;;
        --list) list=1 ;;
        1.[0-9][0-9]) versions+=("$arg") ;;
        -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
        *) echo "build-kubelet-bench.sh: unknown argument '$arg' (expected --force, --quick, --list or a release such as 1.37)" >&2; exit 2 ;;
    esac
done
[ ${#versions[@]} -eq 0 ] && versions=("${all_versions[@]}")
# For tools/setup.sh, which builds (and times) one release a call.
[ "$list" -eq 1 ] && { echo "${versions[@]}"; exit 0; }

command -v go >/dev/null || { echo "build-kubelet-bench.sh: go not found on PATH" >&2; exit 1; }
mkdir -p "$out_dir"

# Every pinned release builds with the local Go (1.37 needs go >= 1.26; 1.29
# asks for go >= 1.21 and builds with 1.26); GOTOOLCHAIN can still be set from outside.
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
par="${KUBELET_BENCH_BUILD_PARALLEL:-$(nproc)}"
quick_gcflags="all=-N -l -dwarf=false"
gcflags=()
if [ "$quick" -eq 1 ]; then
    gcflags=(-gcflags="$quick_gcflags")
    # The compilers inherit it: less time collecting garbage, at most about 1.1 GiB each.
    export GOGC=400
fi

# Whether a binary was built with --quick (Go records its -gcflags in the binary).
is_quick() {
    go version -m "$1" 2>/dev/null | grep -F -- "-gcflags=\"${quick_gcflags}\"" >/dev/null
}

cd "$src_dir"
for v in "${versions[@]}"; do
    tag="k8s${v/./}"
    modfile="go${v/./}.mod"
    sumfile="go${v/./}.sum"
    [ -f "$modfile" ] || { echo "build-kubelet-bench.sh: no ${modfile} for release ${v}" >&2; exit 2; }
    bin="${out_dir}/kubelet-bench-${v}"
    if [ "$force" -eq 0 ] && [ -x "$bin" ]; then
        newer="$(find . "$script" -maxdepth 1 \( -name '*.go' -o -name "$modfile" -o -name "$sumfile" -o -path "$script" \) -newer "$bin" -print -quit)"
        if [ -z "$newer" ] && { [ "$quick" -eq 1 ] || ! is_quick "$bin"; }; then
            echo "build-kubelet-bench.sh: ${bin#"$repo_root"/} is up to date"
            continue
        fi
        [ -z "$newer" ] && echo "build-kubelet-bench.sh: ${bin#"$repo_root"/} is a --quick build: building it optimized"
    fi
    how="-modfile=${modfile} -tags ${tag}, -p ${par}"
    [ "$quick" -eq 1 ] && how="${how}, quick: -gcflags=${quick_gcflags} GOGC=${GOGC}"
    echo "build-kubelet-bench.sh: building ${v} (${how}) -> ${bin#"$repo_root"/}"
    start=$(date +%s)
    go build -p "$par" -modfile="$modfile" -tags "$tag" -trimpath "${gcflags[@]}" -ldflags "-s -w" -o "${bin}.tmp" .
    mv -f "${bin}.tmp" "$bin"
    echo "build-kubelet-bench.sh: built in $(( $(date +%s) - start ))s: $("$bin" version)"
done
