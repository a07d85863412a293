#!/usr/bin/env bash
# Build the real kube-state-metrics that the dashboards' and alerts' tests read the plugin
# pods and the DaemonSet from (tests/harness/kube_state_metrics.py, tests/e2e), from the Go
# module proxy, pinned by the Go module in tools/kube-state-metrics.
#
#   tools/build-kube-state-metrics.sh          build when missing or out of date
#   tools/build-kube-state-metrics.sh --force  rebuild
#
# Output: build/bin/kube-state-metrics (build/ is gitignored); the tests find it there, or
# through $KUBE_STATE_METRICS.
#
# The module's k8s.io/*, golang.org/x/* and protobuf requirements are raised to the ones
# tools/helm pins, so that after tools/build-helm.sh (tools/install-test-tools.sh runs this
# next) those packages come from the build cache. Measured on 2 cores with -p 1 from empty
# module and build caches: helm v3 104 s, helm v4 55 s, then this 93 s (downloads included);
# alone, before the alignment, 386 s. Flags as helm's: CGO off, -trimpath, stripped.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out_dir="${repo_root}/build/bin"
bin="${out_dir}/kube-state-metrics"
force=0
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "build-kube-state-metrics.sh: unknown argument '$arg' (expected --force)" >&2; exit 2 ;;
    esac
done

command -v go >/dev/null || { echo "build-kube-state-metrics.sh: go not found on PATH" >&2; exit 1; }
mkdir -p "$out_dir"

# As tools/build-helm.sh: the local toolchain, only the module proxy, one core left free.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
par="${KSM_BUILD_PARALLEL:-$(( $(nproc) > 1 ? $(nproc) - 1 : 1 ))}"

mod_dir="${repo_root}/tools/kube-state-metrics"
cd "$mod_dir"
if [ "$force" -eq 0 ] && [ -x "$bin" ] && [ "$bin" -nt "${mod_dir}/go.mod" ] && [ "$bin" -nt "${mod_dir}/go.sum" ]; then
    echo "build-kube-state-metrics.sh: ${bin#"$repo_root"/} is up to date"
    exit 0
fi
module="k8s.io/kube-state-metrics/v2"
version="$(go list -m -f '{{.Version}}' "$module")"
# The version the binary reports (kube-state-metrics' own Makefile stamps it so).
ldflags="-s -w -X github.com/prometheus/common/version.Version=${version#v}"
echo "build-kube-state-metrics.sh: building ${module} ${version} -> ${bin#"$repo_root"/} (-p ${par})"
start=$(date +%s)
go build -p "$par" -trimpath -ldflags "$ldflags" -o "${bin}.tmp" "$module"
mv -f "${bin}.tmp" "$bin"
echo "build-kube-state-metrics.sh: ${bin#"$repo_root"/} built in $(( $(date +%s) - start ))s: $("$bin" version 2>&1 | head -1)"
