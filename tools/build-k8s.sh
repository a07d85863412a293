#!/usr/bin/env bash
# Build the Kubernetes binaries of the end-to-end suite (tests/e2e) from the
# Go module proxy, one Go module per release in tools/k8s/<release>: the
# binaries its `tool` block lists (1.35: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet and kubectl, the suite's one client; 1.37: the same
# without kubectl), and `pause`, the pod sandbox's process, from the release's
# build/pause/linux/pause.c (gcc, static: tests/e2e wraps it in the sandbox
# image, as no registry with registry.k8s.io/pause may be reachable).
#
#   tools/build-k8s.sh              build what is missing or out of date, every release
#   tools/build-k8s.sh 1.37         only these releases
#   tools/build-k8s.sh --force      rebuild
#
# Output: build/k8s/<release>/<name> (build/ is gitignored), e.g.
# build/k8s/1.37/kubelet. tests/e2e finds them there, or under $K8S_BIN_DIR
# (then $K8S_BIN_DIR/<release>/). A release is rebuilt only when its go.mod,
# go.sum or this script is newer than one of its binaries. Needs go, gcc and
# libc6-dev (static libc).
#
# Same Go flags as tools/build-kubelet-bench.sh, so the packages both compile
# (the kubelet, client-go, apimachinery, ... at one release's versions) come
# from one shared build cache. Cold, after the kubelet benches filled that
# cache (as tools/setup.sh orders it): 1.35 about 5 minutes on 2 cores, 1.37
# about 490 CPU-seconds more (the control plane's own packages). Warm, seconds.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
script="${repo_root}/tools/$(basename "${BASH_SOURCE[0]}")"
out_root="${K8S_BIN_DIR:-${repo_root}/build/k8s}"
all_releases=(1.35 1.37)
force=0
releases=()
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        1.[0-9][0-9]) releases+=("$arg") ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "build-k8s.sh: unknown argument '$arg' (expected --force or a release such as 1.37)" >&2; exit 2 ;;
    esac
done
[ ${#releases[@]} -eq 0 ] && releases=("${all_releases[@]}")

for tool in go gcc; do
    command -v "$tool" >/dev/null || { echo "build-k8s.sh: $tool not found on PATH" >&2; exit 1; }
done
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
par="${K8S_BUILD_PARALLEL:-$(nproc)}"

build_release() {
    local release="$1" mod_dir="${repo_root}/tools/k8s/$1" out_dir="${out_root}/$1"
    [ -f "${mod_dir}/go.mod" ] || { echo "build-k8s.sh: no tools/k8s/${release}/go.mod" >&2; exit 2; }
    cd "$mod_dir"
    # The module's tool block: k8s.io/kubernetes/cmd/<name> per binary.
    local pkgs
    mapfile -t pkgs < <(go mod edit -json | python3 -c 'import json, sys; [print(t["Path"]) for t in json.load(sys.stdin)["Tool"]]')
    local cmds=("${pkgs[@]##*/}" pause) missing=() c
    mkdir -p "$out_dir"
    for c in "${cmds[@]}"; do
        local bin="${out_dir}/${c}"
        if [ "$force" -eq 1 ] || [ ! -x "$bin" ] || [ go.mod -nt "$bin" ] || [ go.sum -nt "$bin" ] || [ "$script" -nt "$bin" ]; then
            missing+=("$c")
        fi
    done
    if [ ${#missing[@]} -eq 0 ]; then
        echo "build-k8s.sh: ${out_dir#"$repo_root"/} is up to date ($("${out_dir}/kubelet" --version))"
        return
    fi
    local version minor
    version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"   # v1.35.4
    minor="${version#v1.}"; minor="${minor%%.*}"
    # Stamp the release as Kubernetes' own build does (the kubelet reports it to
    # the API server; kubectl version prints it). No build date: reproducible.
    local ldflags="-s -w" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X ${pkg}.gitVersion=${version} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor} -X ${pkg}.gitTreeState=clean"
    done
    local targets=()
    for c in "${missing[@]}"; do [ "$c" = pause ] || targets+=("k8s.io/kubernetes/cmd/${c}"); done
    local tmp="${out_dir}/.tmp" start
    rm -rf "$tmp"; mkdir -p "$tmp"
    echo "build-k8s.sh: building ${missing[*]} ${version} -> ${out_dir#"$repo_root"/} (-p ${par})"
    start=$(date +%s)
    if [ ${#targets[@]} -gt 0 ]; then
        nice -n 10 go build -p "$par" -trimpath -ldflags "$ldflags" -o "$tmp/" "${targets[@]}"
    fi
    # The module zip holds build/pause/linux/pause.c (go mod download put it in the cache).
    local pause_c
    pause_c="$(go mod download -json k8s.io/kubernetes | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')/build/pause/linux/pause.c"
    gcc -Os -Wall -Werror -static -DVERSION="${version}-ate-e2e" -o "$tmp/pause" "$pause_c"
    strip "$tmp/pause"
    for c in "${missing[@]}"; do mv -f "$tmp/$c" "${out_dir}/$c"; done
    rm -rf "$tmp"
    echo "build-k8s.sh: built in $(( $(date +%s) - start ))s: $("${out_dir}/kubelet" --version)"
}

for release in "${releases[@]}"; do
    build_release "$release"
done
