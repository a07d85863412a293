#!/usr/bin/env bash
# Publish one release: the image and the Helm chart, with one version.
#
#   tools/release.sh 0.1.0                  build, tag and push both to ghcr.io/<owner>
#   REGISTRY=registry.example.com/platform tools/release.sh 0.1.0
#   ARCHS=amd64 tools/release.sh 0.1.0      the image for these architectures only
#   tools/release.sh --push-only 0.1.0      push what was built before under the release name
#   tools/release.sh --where 0.1.0          print where they would go, and the install command
#
# The version must already be the one in chart/Chart.yaml (version and appVersion),
# pyproject.toml and app/ate_devplugin/__init__.py: bump them in a commit, add the
# chart/CHANGELOG.md entry, then release that commit.
#
# What it publishes, for REGISTRY=R and VERSION=V. R defaults to ghcr.io/<owner> of the
# chart's `home` value (chart/values.yaml, the one place that names where the project lives;
# https://github.com/ate-dev/ate-devplugin, the project's placeholder organisation, gives
# ghcr.io/ate-dev):
#   image  R/ate-devplugin:V             a manifest list (OCI image index) of one image per
#                                        architecture in ARCHS, each built by tools/build-image.sh
#                                        as R/ate-devplugin:V-<arch> (arm64 under emulation on an
#                                        amd64 host), pushed by `buildah manifest push --all`
#   chart  oci://R/charts/ate-devplugin  version V, pushed by `helm push`; its default image
#                                        is R/ate-devplugin (values.yaml's image.registry and
#                                        image.repository are set to it in the packaged
#                                        copy), tag V
# The chart's links (alerts' runbook_url, NOTES, DeviceClass comments) name the tag vV of
# home's repository: tag the released commit vV and push the tag.
# Users then install it with (the namespace first, labelled for Pod Security's privileged level:
# the daemon mounts host paths; chart/README.md, Install)
#   helm install ate-devplugin oci://R/charts/ate-devplugin --version V --namespace ate-system
#
# Environment:
#   REGISTRY       registry host[:port] and path to publish under (default ghcr.io/<owner of home>)
#   ARCHS          architectures of the image (default "amd64 arm64")
#   HELM           the helm binary (default: helm on PATH, else build/bin/helm-v3)
#   STORAGE_ROOT, STORAGE_DRIVER, ...   passed to tools/build-image.sh and used by buildah
# Log in first where the registry needs it: `buildah login R` and `helm registry login R`.
#
# --push-only pushes a list of the R/ate-devplugin:V-<arch> images of ARCHS when they are
# there (every one of them), else the one image R/ate-devplugin:V (then of one architecture).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
push_only=0
where_only=0
case "${1:-}" in
    --push-only) push_only=1; shift ;;
    --where) where_only=1; shift ;;
    -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
esac
[ $# -eq 1 ] || { echo "usage: tools/release.sh [--push-only | --where] VERSION" >&2; exit 2; }
version="$1"
if [ -z "${REGISTRY:-}" ]; then
    # GitHub's registry of the home's owner; a home elsewhere names no registry.
    home="$(sed -n 's/^home: *//p' chart/values.yaml)"
    owner="$(printf '%s\n' "$home" | sed -n 's|^https://github\.com/\([^/]*\)/[^/]*/\{0,1\}$|\1|p')"
    [ -n "$owner" ] || { echo "release.sh: chart/values.yaml home '$home' is not on github.com: set REGISTRY" >&2; exit 2; }
    REGISTRY="ghcr.io/$(printf '%s' "$owner" | tr '[:upper:]' '[:lower:]')"
fi
REGISTRY="${REGISTRY%/}"
ARCHS="${ARCHS:-amd64 arm64}"
read -r -a archs <<<"$ARCHS"
[ ${#archs[@]} -gt 0 ] || { echo "release.sh: ARCHS is empty" >&2; exit 2; }
HELM="${HELM:-$(command -v helm || echo "$repo_root/build/bin/helm-v3")}"
STORAGE_DRIVER="${STORAGE_DRIVER:-vfs}"
storage=(--storage-driver "$STORAGE_DRIVER")
if [ -n "${STORAGE_ROOT:-}" ]; then
    storage+=(--root "$STORAGE_ROOT" --runroot "$STORAGE_ROOT/run")
fi

# One version everywhere, or no release.
found="$(python3 - "$version" <<'PY'
import re, sys, tomllib
from pathlib import Path
chart = Path("chart/Chart.yaml").read_text()
versions = {
    "chart/Chart.yaml version": re.search(r"^version: *(\S+)", chart, re.M)[1],
    "chart/Chart.yaml appVersion": re.search(r"^appVersion: *\"?([^\"\s]+)", chart, re.M)[1],
    "pyproject.toml version": tomllib.loads(Path("pyproject.toml").read_text())["project"]["version"],
    "app/ate_devplugin/__init__.py __version__":
        re.search(r'^__version__ = "([^"]+)"', Path("app/ate_devplugin/__init__.py").read_text(), re.M)[1],
}
print("\n".join(f"{where} is {v}" for where, v in versions.items() if v != sys.argv[1]))
PY
)"
if [ -n "$found" ]; then
    echo "release.sh: version $version is not the checkout's:" >&2
    echo "$found" >&2
    exit 2
fi
if ! grep -q "^## ${version//./\\.}\b" chart/CHANGELOG.md; then
    echo "release.sh: chart/CHANGELOG.md has no '## $version' entry" >&2
    exit 2
fi

host="${REGISTRY%%/*}"
path=""
[ "$host" != "$REGISTRY" ] && path="${REGISTRY#*/}/"
image="$REGISTRY/ate-devplugin:$version"
chart_ref="oci://$REGISTRY/charts"
install="helm install ate-devplugin $chart_ref/ate-devplugin --version $version --namespace ate-system"
namespace="kubectl create namespace ate-system --dry-run=client -o yaml | kubectl apply -f -
  kubectl label namespace ate-system --overwrite pod-security.kubernetes.io/enforce=privileged"
if [ "$where_only" -eq 1 ]; then
    printf 'image %s\nchart %s/ate-devplugin %s\ninstall %s\n' "$image" "$chart_ref" "$version" "$install"
    exit 0
fi

bh() { buildah "${storage[@]}" "$@"; }
if [ "$push_only" -eq 0 ]; then
    for arch in "${archs[@]}"; do
        ARCH="$arch" IMAGE="$image-$arch" tools/build-image.sh
    done
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
built=()
for arch in "${archs[@]}"; do
    bh inspect --type image "$image-$arch" >/dev/null 2>&1 && built+=("$arch")
done
if [ ${#built[@]} -gt 0 ]; then
    if [ ${#built[@]} -ne ${#archs[@]} ]; then
        echo "release.sh: ARCHS is '${ARCHS}' but only ${built[*]} of $image-<arch> are built" >&2
        exit 2
    fi
    # A list made afresh: one left from an earlier build would keep that build's images.
    bh manifest rm "$image" >/dev/null 2>&1 || true
    bh manifest create "$image" >/dev/null
    for arch in "${archs[@]}"; do
        bh manifest add "$image" "containers-storage:$image-$arch" >/dev/null
    done
    echo "release.sh: pushing $image (${archs[*]})"
    bh manifest push --all --quiet --digestfile "$work/digest" "$image" "docker://$image"
else
    echo "release.sh: pushing $image (one architecture)"
    bh push --digestfile "$work/digest" "$image" "docker://$image"
fi
echo "release.sh: pushed $image@$(cat "$work/digest")"

# The packaged chart points at the image just pushed.
cp -a chart "$work/ate-devplugin"
python3 - "$work/ate-devplugin/values.yaml" "$host" "${path}ate-devplugin" <<'PY'
import sys
from pathlib import Path
values, host, repository = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
lines = values.read_text().splitlines(keepends=True)
start = lines.index("image:\n")
todo = {"  registry: ": host, "  repository: ": repository}
for i in range(start + 1, len(lines)):
    if not lines[i].startswith("  "):
        break
    for key, value in list(todo.items()):
        if lines[i].startswith(key):
            lines[i] = f"{key}{value}\n"
            del todo[key]
if todo:
    sys.exit(f"release.sh: no {', '.join(k.strip() for k in todo)} under image: in values.yaml")
values.write_text("".join(lines))
PY
"$HELM" package "$work/ate-devplugin" --destination "$work" >/dev/null
echo "release.sh: pushing chart ate-devplugin $version to $chart_ref"
"$HELM" push "$work/ate-devplugin-$version.tgz" "$chart_ref"
echo "release.sh: the chart's runbook and documentation links point at the tag v$version of home's"
echo "  repository: tag this commit and push it (git tag v$version && git push origin v$version)"
echo "release.sh: done. Install with:"
echo "  $namespace"
echo "  $install"
