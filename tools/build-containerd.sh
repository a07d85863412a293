#!/usr/bin/env bash
# Build containerd 2 for the end-to-end suite's CDI cluster (tests/e2e, runtime
# "containerd2") from the Go module proxy: containerd, containerd-shim-runc-v2
# and ctr of github.com/containerd/containerd/v2 at one pinned release. Debian's
# containerd 1.6 has no CDI; its runc (/usr/sbin/runc) is kept and runs the pods.
#
#   tools/build-containerd.sh            build unless already built at the version
#   tools/build-containerd.sh --force    rebuild
#
# Output: build/containerd2/<name> (build/ is gitignored); tests/e2e finds them
# there, or in $CONTAINERD2_BIN_DIR. Pure Go (CGO_ENABLED=0), the local toolchain
# only; the Go module and build caches are the machine's, shared with the other
# builds (grpc, protobuf, x/sys compile once). Cold (empty build cache) about
# 175 CPU-seconds; already built at the version, a version check and nothing else.
set -euo pipefail

version="v2.4.2"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out_dir="${CONTAINERD2_BIN_DIR:-${repo_root}/build/containerd2}"
cmds=(containerd containerd-shim-runc-v2 ctr)
force=0
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "build-containerd.sh: unknown argument '$arg' (expected --force)" >&2; exit 2 ;;
    esac
done
command -v go >/dev/null || { echo "build-containerd.sh: go not found on PATH" >&2; exit 1; }

built() {
    for c in "${cmds[@]}"; do [ -x "${out_dir}/$c" ] || return 1; done
    # "containerd github.com/containerd/containerd/v2 v2.4.2 ..."
    "${out_dir}/containerd" --version 2>/dev/null | grep -Fqw "${version}"
}
if [ "$force" -eq 0 ] && built; then
    echo "build-containerd.sh: ${out_dir#"$repo_root"/} is up to date ($("${out_dir}/containerd" --version))"
    exit 0
fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-buildvcs=false"
mod="github.com/containerd/containerd/v2"
tmp="${out_dir}/.tmp"
rm -rf "$tmp"; mkdir -p "$tmp"
echo "build-containerd.sh: building ${cmds[*]} ${version} -> ${out_dir#"$repo_root"/}"
start=$(date +%s)
# go install pkg@version builds with the release's own go.mod; the version is
# stamped as containerd's Makefile does, so `containerd --version` names it.
GOBIN="$tmp" nice -n 10 go install -trimpath -ldflags "-s -w -X ${mod}/version.Version=${version}" \
    "${mod}/cmd/containerd@${version}" "${mod}/cmd/containerd-shim-runc-v2@${version}" "${mod}/cmd/ctr@${version}"
for c in "${cmds[@]}"; do mv -f "$tmp/$c" "${out_dir}/$c"; done
rm -rf "$tmp"
echo "build-containerd.sh: built in $(( $(date +%s) - start ))s: $("${out_dir}/containerd" --version)"
