#!/usr/bin/env bash
# Installs what the demo, the benches and the tests need on a fresh machine, then builds
# the Go peers.
#   tools/setup.sh demo    what `make demo` runs, no more: the package with its runtime
#                          dependencies and the kubelet bench of 1.37, a --quick build when
#                          none is there (tools/build-kubelet-bench.sh)
#   tools/setup.sh bench   the dev extra and the kubelet bench of every release, optimized
#   tools/setup.sh test    everything: + Debian tools, helm, the image's base, and the
#                          clusters of tests/e2e (Kubernetes 1.35 and 1.37 binaries,
#                          containerd 1.6 from Debian and containerd 2 built from source)
# Idempotent: installed packages and up-to-date builds are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-test}
case "$what" in
  demo | bench | test) ;;
  *) echo "setup.sh: unknown '$what' (expected demo, bench or test)" >&2; exit 2 ;;
esac

# One line a step, `setup: <step> took N s`, so a CI log shows where setup's time went.
took() { echo "setup: $1 took $((SECONDS - $2)) s"; }
step() {  # step NAME COMMAND...: run it (a failure still ends setup), then say how long
  local name=$1 start=$SECONDS
  shift
  "$@"
  took "$name" "$start"
}

apt_packages=(util-linux)
if [ "$what" = test ]; then
  # prometheus (server + promtool) for the metrics, alert and dashboard tests; buildah,
  # podman and debootstrap to build and run the image without a Docker engine, and
  # qemu-user-static to build and run its arm64 image under emulation; python3-venv for
  # the unprivileged unit-test run (make unit-nonroot).
  apt_packages+=(prometheus buildah podman debootstrap qemu-user-static python3-venv)
  # The clusters of tests/e2e: container runtime, etcd, pod network, curl and
  # ip inside its namespaces; gcc and libc6-dev for the statically linked pause image.
  apt_packages+=(containerd runc etcd-server containernetworking-plugins curl iproute2 gcc libc6-dev)
  # The OCI registry the e2e user path installs the published chart and image from.
  apt_packages+=(docker-registry)
  # The rendered dashboards (tests/dashboards/test_dashboards_rendered.py): headless Chromium and fonts.
  apt_packages+=(chromium fonts-dejavu-core)
  # npm for the Perses page; machines that bring their own Node.js keep it.
  command -v npm >/dev/null || apt_packages+=(nodejs npm)
fi
start=$SECONDS
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Install only: never start containerd or etcd as host services (tests/e2e runs its
  # own, in private namespaces). policy-rc.d is what invoke-rc.d and systemd's helpers ask.
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && made_policy=1
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [ "$made_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
took apt "$start"

# Every Python dependency of the tests, bench and tools is in pyproject's dev extra, the
# DRA driver's client (the dra extra) included. The demo imports only what the daemon does.
extra="[dev]"
[ "$what" = demo ] && extra=""
step pip python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore -e ".${extra}"

if [ "$what" = demo ]; then
  # The demo runs the newest release only, and not for speed.
  step "kubelet bench 1.37" tools/build-kubelet-bench.sh --quick 1.37
else
  for release in $(tools/build-kubelet-bench.sh --list); do
    step "kubelet bench $release" tools/build-kubelet-bench.sh "$release"
  done
fi
if [ "$what" = test ]; then
  # Kubernetes 1.37 for tests/e2e (control plane and kubelet; about 490 CPU-seconds cold),
  # in the background while the chart tools install: checkov's venv waits on the network
  # and helm builds with -p 1, so the second core would idle. Its output follows at the end.
  k8s137_log="$(mktemp)"
  k8s137_start=$(date +%s)
  tools/build-k8s.sh 1.37 >"$k8s137_log" 2>&1 &
  k8s137=$!
  trap 'kill "$k8s137" 2>/dev/null || true; rm -f "$k8s137_log"' EXIT
  # Chart tools outside the dev extra: checkov (own venv), helm v3 and v4.
  step "helm and checkov" tools/install-test-tools.sh --no-apt
  # Kubernetes 1.35 for tests/e2e: the same and kubectl, the client of both releases.
  step "k8s 1.35" tools/build-k8s.sh 1.35
  # containerd 2 (CDI) for the e2e clusters' second runtime; Debian's runc runs its pods.
  step containerd tools/build-containerd.sh
  # node-feature-discovery (nfd-master, nfd-worker) for the e2e module that puts the
  # daemon's KVM facts on the Node as labels (tests/e2e/test_nfd_labels.py).
  step nfd tools/build-nfd.sh
  # The Perses page's npm packages, exactly as locked; again only when the lock changed.
  page=tools/render-dashboards
  start=$SECONDS
  if [ ! -e "$page/node_modules/.package-lock.json" ] || [ "$page/package-lock.json" -nt "$page/node_modules/.package-lock.json" ]; then
    (cd "$page" && npm ci --no-audit --no-fund --loglevel=error)
  fi
  took npm "$start"
  status=0
  wait "$k8s137" || status=$?
  trap 'rm -f "$k8s137_log"' EXIT  # reaped: nothing left to kill
  cat "$k8s137_log"
  # It ran beside the steps above: its time is to its log's last line (build-k8s.sh ends
  # with one either way), not to when setup came to wait for it.
  echo "setup: k8s 1.37 (background) took $(($(stat -c %Y "$k8s137_log") - k8s137_start)) s"
  [ "$status" -eq 0 ] || { echo "setup: tools/build-k8s.sh 1.37 failed ($status)" >&2; exit 1; }
fi
