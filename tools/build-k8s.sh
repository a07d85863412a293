#!/usr/bin/env bash
# Build the Kubernetes binaries of the end-to-end suite (tests/e2e) from the
# Go module proxy, pinned by the Go module in tools/k8s: kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet and kubectl; and `pause`,
# the pod sandbox's process, from the same module's build/pause/linux/pause.c
# (gcc, static: tests/e2e wraps it in the sandbox image, as no registry with
# registry.k8s.io/pause may be reachable).
#
#   tools/build-k8s.sh            build what is missing or out of date
#   tools/build-k8s.sh --force    rebuild all five
#
# Output: build/k8s/<name> (build/ is gitignored). tests/e2e finds them there,
# or in $K8S_BIN_DIR. A binary is rebuilt only when tools/k8s/go.mod, go.sum
# or this script is newer than it. Needs go, gcc and libc6-dev (static libc).
#
# Same Go flags as tools/build-kubelet-bench.sh, so the packages both compile
# (the kubelet, client-go, apimachinery, ...) come from one shared build cache.
# Cold (empty build cache) this is the longest step of `make test`: about
# 20 minutes on 2 cores; warm, seconds.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
script="${repo_root}/tools/$(basename "${BASH_SOURCE[0]}")"
mod_dir="${repo_root}/tools/k8s"
out_dir="${K8S_BIN_DIR:-${repo_root}/build/k8s}"
cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl pause)
force=0
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "build-k8s.sh: unknown argument '$arg' (expected --force)" >&2; exit 2 ;;
    esac
done

for tool in go gcc; do
    command -v "$tool" >/dev/null || { echo "build-k8s.sh: $tool not found on PATH" >&2; exit 1; }
done
mkdir -p "$out_dir"

export GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
par="${K8S_BUILD_PARALLEL:-$(nproc)}"

missing=()
for c in "${cmds[@]}"; do
    bin="${out_dir}/${c}"
    if [ "$force" -eq 1 ] || [ ! -x "$bin" ] || [ "${mod_dir}/go.mod" -nt "$bin" ] \
        || [ "${mod_dir}/go.sum" -nt "$bin" ] || [ "$script" -nt "$bin" ]; then
        missing+=("$c")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "build-k8s.sh: ${out_dir#"$repo_root"/} is up to date ($("${out_dir}/kubelet" --version))"
    exit 0
fi

cd "$mod_dir"
version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"   # v1.35.4
minor="${version#v1.}"; minor="${minor%%.*}"
# Stamp the release as Kubernetes' own build does (the kubelet reports it to
# the API server; kubectl version prints it). No build date: reproducible.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X ${pkg}.gitVersion=${version} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor} -X ${pkg}.gitTreeState=clean"
done
targets=()
for c in "${missing[@]}"; do [ "$c" = pause ] || targets+=("k8s.io/kubernetes/cmd/${c}"); done
tmp="${out_dir}/.tmp"
rm -rf "$tmp"; mkdir -p "$tmp"
echo "build-k8s.sh: building ${missing[*]} ${version} -> ${out_dir#"$repo_root"/} (-p ${par})"
start=$(date +%s)
if [ ${#targets[@]} -gt 0 ]; then
    nice -n 10 go build -p "$par" -trimpath -ldflags "$ldflags" -o "$tmp/" "${targets[@]}"
fi
# The module zip holds build/pause/linux/pause.c (go mod download put it in the cache).
pause_c="$(go mod download -json k8s.io/kubernetes | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')/build/pause/linux/pause.c"
gcc -Os -Wall -Werror -static -DVERSION="${version}-ate-e2e" -o "$tmp/pause" "$pause_c"
strip "$tmp/pause"
for c in "${missing[@]}"; do mv -f "$tmp/$c" "${out_dir}/$c"; done
rm -rf "$tmp"
echo "build-k8s.sh: built in $(( $(date +%s) - start ))s: $("${out_dir}/kubelet" --version)"
