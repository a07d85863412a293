#!/usr/bin/env bash
# Build the real helm CLIs (v3 and v4) used by tests/chart from the Go module
# proxy, pinned by the Go module in tools/helm (helm.sh/helm/v3 and
# helm.sh/helm/v4 as `tool` requirements of one module, so their shared
# dependencies are compiled once).
#
#   tools/build-helm.sh            build what is missing or out of date
#   tools/build-helm.sh --force    rebuild both
#   tools/build-helm.sh v3         only one major version (v3 or v4)
#
# Output: build/bin/helm-v3 and build/bin/helm-v4 (build/ is gitignored).
# The tests find them there, or through $HELM_V3 / $HELM_V4.
#
# Flags follow helm's own release build: CGO off, -trimpath, stripped (-s -w),
# version stamped with -X so `helm version` reports the pinned release, and
# (v3 only) the default Kubernetes version taken from the client-go module,
# as helm's Makefile does. v4 reads that from the embedded build info itself.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out_dir="${repo_root}/build/bin"
force=0
majors=()
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        v3|v4) majors+=("$arg") ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "build-helm.sh: unknown argument '$arg' (expected --force, v3 or v4)" >&2; exit 2 ;;
    esac
done
[ ${#majors[@]} -eq 0 ] && majors=(v3 v4)

command -v go >/dev/null || { echo "build-helm.sh: go not found on PATH" >&2; exit 1; }
mkdir -p "$out_dir"

# Never switch toolchains behind our back; never touch the network except the
# module proxy; leave one core for whatever else runs (CI has two).
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
par="${HELM_BUILD_PARALLEL:-$(( $(nproc) > 1 ? $(nproc) - 1 : 1 ))}"

mod_dir="${repo_root}/tools/helm"
cd "$mod_dir"
for major in "${majors[@]}"; do
    bin="${out_dir}/helm-${major}"
    if [ "$force" -eq 0 ] && [ -x "$bin" ] \
        && [ "$bin" -nt "${mod_dir}/go.mod" ] && [ "$bin" -nt "${mod_dir}/go.sum" ]; then
        echo "build-helm.sh: ${bin#"$repo_root"/} is up to date ($("$bin" version --short 2>/dev/null || echo '?'))"
        continue
    fi
    helm_mod="helm.sh/helm/${major}"
    version="$(go list -m -f '{{.Version}}' "$helm_mod")"
    ldflags="-s -w -X ${helm_mod}/internal/version.version=${version} -X ${helm_mod}/internal/version.gitTreeState=clean"
    if [ "$major" = v3 ]; then
        # client-go v0.N.x is Kubernetes 1.N (same derivation as helm's Makefile).
        cg="$(go list -m -f '{{.Version}}' k8s.io/client-go)"
        cg="${cg#v}"; kmaj=$(( ${cg%%.*} + 1 )); rest="${cg#*.}"; kmin="${rest%%.*}"
        for pkg in pkg/lint/rules pkg/chartutil; do
            ldflags+=" -X ${helm_mod}/${pkg}.k8sVersionMajor=${kmaj} -X ${helm_mod}/${pkg}.k8sVersionMinor=${kmin}"
        done
    fi
    echo "build-helm.sh: building ${helm_mod} ${version} -> ${bin#"$repo_root"/} (-p ${par})"
    start=$(date +%s)
    go build -p "$par" -trimpath -ldflags "$ldflags" -o "${bin}.tmp" "${helm_mod}/cmd/helm"
    mv -f "${bin}.tmp" "$bin"
    echo "build-helm.sh: ${bin#"$repo_root"/} built in $(( $(date +%s) - start ))s: $("$bin" version --short)"
done
