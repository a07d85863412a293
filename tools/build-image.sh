#!/usr/bin/env bash
# Build the daemon's container image from the repository's Dockerfile with
# buildah (no Docker engine needed).
#
#   tools/build-image.sh                      build localhost/ate-devplugin:dev
#   IMAGE=registry.example/ate-devplugin:1.2.3 tools/build-image.sh
#   ARCH=arm64 tools/build-image.sh           the image of another architecture, under emulation
#   tools/build-image.sh --base-only          only make sure the base image exists
#
# Base image: the Dockerfile starts FROM docker.io/library/debian:bookworm-slim.
# Where that cannot be pulled (no registry but Debian's archive reachable),
# this script makes it locally: `debootstrap --variant=minbase bookworm` and
# `podman import` under that exact name. Set BASE_FROM_DEBOOTSTRAP=0 to skip
# that step and let buildah pull the real image instead.
#
# Architectures: ARCH (amd64 or arm64; default the host's) is the image's
# platform, linux/ARCH. The host's builds FROM the name above; another takes the
# name the official image has for that architecture alone (docker.io/arm64v8/
# debian:bookworm-slim, docker.io/amd64/debian:bookworm-slim), handed to the
# Dockerfile as BASE_IMAGE, and debootstrap makes that one for ARCH. Its
# programs run under emulation: Debian's qemu-user-static, which this script
# registers with binfmt_misc (with the fix-binary flag, so that it also runs in
# the build's chroot) when it is not. pip in the build then installs that
# architecture's wheels.
#
# Environment:
#   IMAGE            tag to build (default localhost/ate-devplugin:dev)
#   ARCH             architecture to build for (default: the host's, dpkg --print-architecture)
#   STORAGE_DRIVER   containers/storage driver (default vfs: works in any sandbox)
#   HOST_CA_BUNDLE   CA bundle handed to pip inside the build (default: the host's)
#   DEBIAN_MIRROR    mirror for debootstrap (default http://deb.debian.org/debian)
#   BUILD_CONTEXT    source tree to build (default: this repository)
#   STORAGE_ROOT     containers/storage root (default: the system's, /var/lib/containers/storage)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_CONTEXT="$(cd "${BUILD_CONTEXT:-$repo_root}" && pwd)"

IMAGE="${IMAGE:-localhost/ate-devplugin:dev}"
host_arch="$(dpkg --print-architecture 2>/dev/null || uname -m)"
case "$host_arch" in x86_64) host_arch=amd64 ;; aarch64) host_arch=arm64 ;; esac
ARCH="${ARCH:-$host_arch}"
case "$ARCH" in
    amd64) qemu_arch=x86_64 arch_repository=amd64 variant="" ;;
    arm64) qemu_arch=aarch64 arch_repository=arm64v8 variant=v8 ;;
    *) echo "build-image.sh: ARCH=$ARCH: expected amd64 or arm64" >&2; exit 2 ;;
esac
BASE_IMAGE="docker.io/library/debian:bookworm-slim"
[ "$ARCH" != "$host_arch" ] && BASE_IMAGE="docker.io/${arch_repository}/debian:bookworm-slim"
STORAGE_DRIVER="${STORAGE_DRIVER:-vfs}"
HOST_CA_BUNDLE="${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE_FROM_DEBOOTSTRAP="${BASE_FROM_DEBOOTSTRAP:-1}"
base_only=0
case "${1:-}" in
    "") ;;
    --base-only) base_only=1 ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "build-image.sh: unknown argument '$1'" >&2; exit 2 ;;
esac

for tool in buildah podman debootstrap; do
    command -v "$tool" >/dev/null || {
        echo "build-image.sh: $tool not found (apt-get install buildah podman debootstrap)" >&2
        exit 1
    }
done

# Same storage for every call, so buildah sees what podman imported.
storage=(--storage-driver "$STORAGE_DRIVER")
if [ -n "${STORAGE_ROOT:-}" ]; then
    storage+=(--root "$STORAGE_ROOT" --runroot "$STORAGE_ROOT/run")
fi
bh() { buildah "${storage[@]}" "$@"; }

# Programs of another architecture run through qemu-user-static, registered with binfmt_misc.
ensure_emulation() {
    [ "$ARCH" = "$host_arch" ] && return
    local conf="/usr/lib/binfmt.d/qemu-${qemu_arch}.conf" misc=/proc/sys/fs/binfmt_misc
    [ -r "$conf" ] || {
        echo "build-image.sh: ARCH=$ARCH needs emulation: apt-get install qemu-user-static (no $conf)" >&2
        exit 1
    }
    [ -e "$misc/register" ] || mount -t binfmt_misc binfmt_misc "$misc" || {
        echo "build-image.sh: cannot mount binfmt_misc on $misc (needs root and CONFIG_BINFMT_MISC)" >&2
        exit 1
    }
    if [ ! -e "$misc/qemu-${qemu_arch}" ]; then
        grep -v '^#' "$conf" >"$misc/register"
        echo "build-image.sh: registered qemu-${qemu_arch} with binfmt_misc"
    fi
    # F (fix-binary): the kernel holds the interpreter open, so it runs inside a chroot too.
    grep -qx enabled "$misc/qemu-${qemu_arch}" && grep -q '^flags: .*F' "$misc/qemu-${qemu_arch}" || {
        echo "build-image.sh: $misc/qemu-${qemu_arch} is disabled or lacks the F flag:" >&2
        cat "$misc/qemu-${qemu_arch}" >&2
        exit 1
    }
}

ensure_base() {
    if bh inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
        echo "build-image.sh: base $BASE_IMAGE present"
        return
    fi
    if [ "$BASE_FROM_DEBOOTSTRAP" != 1 ]; then
        echo "build-image.sh: base $BASE_IMAGE absent; buildah will pull it"
        return
    fi
    local rootfs="${repo_root}/build/debootstrap-bookworm-${ARCH}"
    rm -rf "$rootfs"
    mkdir -p "$rootfs"
    echo "build-image.sh: debootstrap --arch=${ARCH} --variant=minbase bookworm -> ${rootfs#"$repo_root"/}"
    local start; start=$(date +%s)
    debootstrap --arch="$ARCH" --variant=minbase bookworm "$rootfs" "$DEBIAN_MIRROR" >"${rootfs}.log" 2>&1 || {
        tail -20 "${rootfs}.log" >&2
        echo "build-image.sh: debootstrap failed (log: ${rootfs}.log)" >&2
        exit 1
    }
    # Close to the official slim image: no apt lists or caches, no docs, man
    # pages or locales, and apt set to drop downloaded packages.
    rm -rf "${rootfs:?}"/var/lib/apt/lists/* "${rootfs:?}"/var/cache/apt/*.bin \
        "${rootfs:?}"/var/cache/apt/archives/*.deb "${rootfs:?}"/usr/share/doc/* \
        "${rootfs:?}"/usr/share/man/* "${rootfs:?}"/usr/share/info/* \
        "${rootfs:?}"/usr/share/locale/* "${rootfs:?}"/var/log/*.log
    printf '%s\n' 'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };' \
        'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };' \
        'Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";' \
        > "${rootfs}/etc/apt/apt.conf.d/docker-clean"
    tar -C "$rootfs" -c . | podman "${storage[@]}" import --os linux --arch "$ARCH" ${variant:+--variant "$variant"} \
        --change 'CMD ["bash"]' - "$BASE_IMAGE" >/dev/null
    rm -rf "$rootfs"
    echo "build-image.sh: base $BASE_IMAGE imported in $(( $(date +%s) - start ))s"
}

ensure_emulation
ensure_base
[ "$base_only" -eq 1 ] && exit 0

cd "$BUILD_CONTEXT"
[ -f pyproject.toml ] || { echo "build-image.sh: no pyproject.toml in $BUILD_CONTEXT" >&2; exit 1; }
project_field() {  # project.<name> from pyproject.toml, when it is a plain string
    python3 -c 'import sys, tomllib
v = tomllib.load(open("pyproject.toml", "rb")).get("project", {}).get(sys.argv[1])
print(v if isinstance(v, str) else sys.argv[2])' "$1" "$2" 2>/dev/null || echo "$2"
}
version="$(project_field version unknown)"
licenses="$(project_field license "")"
# The commit built: the image's revision label and, through ENV, the daemon's
# ate_devplugin_build_info. "-dirty" when the tree has uncommitted changes.
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ "$revision" != unknown ] && [ -n "$(git status --porcelain 2>/dev/null)" ]; then
    revision="${revision}-dirty"
fi
created="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

ca_args=()
if [ -r "$HOST_CA_BUNDLE" ]; then
    ca_args=(--volume "${HOST_CA_BUNDLE}:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
fi

echo "build-image.sh: building $IMAGE for linux/$ARCH (version $version, revision ${revision:0:12})"
previous="$(bh inspect --type image --format '{{.FromImageID}}' "$IMAGE" 2>/dev/null || true)"
start=$(date +%s)
bh bud --isolation chroot --network host --layers=false \
    --platform "linux/${ARCH}" --build-arg "BASE_IMAGE=${BASE_IMAGE}" \
    "${ca_args[@]}" \
    --build-arg "VERSION=${version}" \
    --build-arg "REVISION=${revision}" \
    --build-arg "CREATED=${created}" \
    --build-arg "LICENSES=${licenses}" \
    --tag "$IMAGE" \
    --file Dockerfile .
echo "build-image.sh: built $IMAGE in $(( $(date +%s) - start ))s"
# The image this tag pointed at before is now untagged: remove it (vfs keeps full copies).
current="$(bh inspect --type image --format '{{.FromImageID}}' "$IMAGE")"
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
    bh rmi "$previous" >/dev/null 2>&1 || true
fi
bh images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$IMAGE"
