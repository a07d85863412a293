"""The e2e suite's consumer: a real VMM, QEMU from Debian, booting a guest the suite builds.

* :func:`build_guest`: tests/e2e/guest/guest.S, assembled and linked with Debian's binutils
  (``as --32``, ``ld -m elf_i386``), as the pause image's binary is compiled with gcc;
* :func:`build_image`: :data:`VMM_IMAGE`, the debootstrapped Debian base of
  tools/build-image.sh with ``qemu-system-x86`` and ``iproute2`` installed by apt-get (no
  recommends), and the guest at :data:`GUEST`; built once per session (tests/e2e/clusters.py);
* :func:`worker_pod`: docs/examples/microvm-worker-pod.yaml with that image, its QEMU
  command run by :data:`REPORT`, which prints first what the container is (uid, effective
  capabilities, the cgroup file system, the device nodes, the device cgroup rules on v1)
  and after QEMU its exit code and how long it ran;
* :class:`QemuRun`: what such a pod printed and how it ended.

The guest prints :data:`MARKER`, then :data:`NIC` (its virtio-net NIC on PCI bus 0) and
ends QEMU through isa-debug-exit with :data:`BOOTED` (67). Without /dev/kvm QEMU stops
before the guest with :data:`NO_KVM`.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.harness.image import buildah

REPO = Path(__file__).resolve().parents[2]
GUEST_DIR = Path(__file__).resolve().parent / "guest"
WORKER_POD = REPO / "docs" / "examples" / "microvm-worker-pod.yaml"
WORKER_VALUES = REPO / "docs" / "examples" / "microvm-worker-values.yaml"
BASE_IMAGE = "docker.io/library/debian:bookworm-slim"  # tools/build-image.sh's base
VMM_IMAGE = "localhost/ate-e2e-vmm:e2e"
GUEST = "/opt/microvm/guest.elf"  # where docs/examples/microvm-worker-pod.yaml boots it from
PACKAGES = ("qemu-system-x86", "iproute2")
MARKER = "ate-e2e guest: booted"
NIC = re.compile(r"ate-e2e guest: virtio device 1af4:(?P<device>[0-9a-f]{4}) on PCI bus 0, slot 0x[0-9a-f]{4}")
VIRTIO_NET = "1000"  # virtio-net's (transitional) PCI device ID
BOOTED = 67  # (0x21 << 1) | 1: the guest found its NIC
NO_KVM = "Could not access KVM kernel module: No such file or directory"

# Run in the init container as `sh -c INIT_REPORT tap <its command>`: its capabilities, then the command.
INIT_REPORT = r"""
echo "ate-e2e: uid=$(id -u) $(sed -n 's/^\(CapEff\|NoNewPrivs\):[[:space:]]*/\1=/p' /proc/self/status | tr '\n' ' ')"
exec "$@"
"""
# Run in the VMM container as `sh -c REPORT vmm <QEMU command>`: what the container is,
# then QEMU itself (its output and the guest's serial console unchanged), its exit code and
# time. With ATE_E2E_HOLD set it then keeps running (as a worker does) until SIGTERM.
REPORT = r"""
say() { echo "ate-e2e: $*"; }
say "uid=$(id -u) gid=$(id -g) groups=$(id -G | tr ' ' ,)"
say "$(sed -n 's/^\(CapEff\|NoNewPrivs\):[[:space:]]*/\1=/p' /proc/self/status | tr '\n' ' ')"
say "cgroup=$(stat -f -c %T /sys/fs/cgroup)"
for node in /dev/kvm /dev/net/tun; do say "node $node $(stat -c '%A %u %g %t:%T' $node 2>&1)"; done
if [ -r /sys/fs/cgroup/devices/devices.list ]; then
    sed 's/^/ate-e2e: devices.list /' /sys/fs/cgroup/devices/devices.list
fi
start=$(date +%s%N)
"$@"
code=$?
end=$(date +%s%N)
say "qemu exit=$code ms=$(( (end - start) / 1000000 ))"
if [ -r /sys/fs/cgroup/memory/memory.max_usage_in_bytes ]; then
    say "memory peak=$(cat /sys/fs/cgroup/memory/memory.max_usage_in_bytes)"
fi
if [ -n "${ATE_E2E_HOLD:-}" ]; then
    trap 'exit 0' TERM
    while :; do sleep 1 & wait $!; done
fi
exit $code
"""


def kvm_kind() -> tuple[str, str]:
    """("hardware", why) where /dev/kvm is served by the CPU's virtualisation (vmx or svm,
    kvm_intel or kvm_amd loaded, no PVM); ("software", why) where it is PVM or the CPU
    has no virtualisation; ("none", why) without /dev/kvm."""
    if not Path("/dev/kvm").is_char_device():
        return "none", "no /dev/kvm"
    flags = {f for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
             for f in line.split(":", 1)[1].split()}  # fmt: skip
    cpu = sorted(flags & {"vmx", "svm"})
    modules = [m for m in ("kvm_intel", "kvm_amd", "kvm_pvm") if Path("/sys/module", m).is_dir()]
    why = f"/proc/cpuinfo has {cpu or 'no vmx or svm flag'}; loaded: {', '.join(modules) or 'no KVM vendor module'}"
    if cpu and "kvm_pvm" not in modules and {"kvm_intel", "kvm_amd"} & set(modules):
        return "hardware", why
    return "software", why + (" (KVM is PVM, a software virtualisation)" if "kvm_pvm" in modules else "")


def build_guest(dest: Path) -> Path:
    """The guest ELF, built in ``dest`` from tests/e2e/guest."""
    dest.mkdir(parents=True, exist_ok=True)
    obj, elf = dest / "guest.o", dest / "guest.elf"
    for argv in (
        ["as", "--32", "-o", str(obj), str(GUEST_DIR / "guest.S")],
        ["ld", "-m", "elf_i386", "--no-warn-rwx-segments", "-T", str(GUEST_DIR / "guest.ld"), "-o", str(elf), str(obj)],
    ):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if out.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed: {out.stderr}")
    return elf


def build_image(guest: Path, name: str) -> str:
    """Build the VMM image as ``name``: the base (made by tools/build-image.sh when it is
    not there yet), QEMU and iproute2 from Debian's archive, the guest. Returns a line
    saying how long it took and how large it is."""
    start = time.monotonic()
    base = subprocess.run(
        [str(REPO / "tools" / "build-image.sh"), "--base-only"], capture_output=True, text=True, timeout=1200,
        env={**os.environ, "STORAGE_DRIVER": "vfs"}, check=False,
    )  # fmt: skip
    assert base.returncode == 0, f"the base image: {base.stdout[-3000:]}{base.stderr[-3000:]}"
    container = buildah("from", "--pull-never", BASE_IMAGE).stdout.strip()
    try:
        install = (
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
            f"{' '.join(PACKAGES)} >/dev/null && apt-get clean && "
            "rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /usr/share/locale/*"
        )
        buildah("run", "--isolation", "chroot", "--network", "host", container, "--", "sh", "-ec", install,
                timeout=1200)  # fmt: skip
        buildah("copy", "--chmod", "0644", container, str(guest), GUEST)
        buildah("commit", "--quiet", container, name, timeout=600)
    finally:
        buildah("rm", container, check=False)
    size = buildah("images", "--format", "{{.Size}}", name).stdout.strip()
    return f"VMM image {name} built in {time.monotonic() - start:.0f}s ({size}: {', '.join(PACKAGES)})"


def save_image(name: str, dest: Path) -> Path:
    """Write ``name`` to ``dest`` as a docker-archive tagged :data:`VMM_IMAGE`."""
    dest.unlink(missing_ok=True)
    buildah("push", "--quiet", name, f"docker-archive:{dest}:{VMM_IMAGE}", timeout=600)
    return dest


def worker_pod(
    name: str, *, kvm: bool = True, node: str | None = None, hold: bool = False, namespace: str | None = None
) -> dict[str, Any]:
    """docs/examples/microvm-worker-pod.yaml with the VMM image (never pulled), its QEMU
    command run by :data:`REPORT` (the init container's by :data:`INIT_REPORT`); without
    ``ate.dev/kvm`` unless ``kvm``; on ``node`` when given (a nodeSelector: the scheduler
    still decides it fits); running on after QEMU when ``hold``."""
    pod: dict[str, Any] = copy.deepcopy(yaml.safe_load(WORKER_POD.read_text()))
    pod["metadata"]["name"] = name
    if namespace:
        pod["metadata"]["namespace"] = namespace
    for container in pod["spec"]["initContainers"] + pod["spec"]["containers"]:
        container.update(image=VMM_IMAGE, imagePullPolicy="Never")
    (tap,) = pod["spec"]["initContainers"]
    tap["command"] = ["sh", "-c", INIT_REPORT, "tap", *tap["command"]]
    (vmm,) = pod["spec"]["containers"]
    vmm["command"] = ["sh", "-c", REPORT, "vmm", *vmm["command"]]
    if not kvm:
        del vmm["resources"]["limits"]["ate.dev/kvm"]
    if hold:
        vmm["env"] = [{"name": "ATE_E2E_HOLD", "value": "1"}]
    if node is not None:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return pod


@dataclass
class QemuRun:
    """What the VMM container of a worker pod printed (``kubectl logs -c vmm``) and how it
    ended (``exit_code``: its terminated state's, None while it runs)."""

    logs: str
    exit_code: int | None = None
    phase: str = ""
    node: str = ""

    def facts(self) -> dict[str, str]:
        """The ``key=value`` words of REPORT's lines (``uid``, ``CapEff``, ``cgroup``, ``exit``, ``ms``, ...)."""
        found: dict[str, str] = {}
        for line in self.logs.splitlines():
            if line.startswith("ate-e2e: ") and not line.startswith(("ate-e2e: node ", "ate-e2e: devices.list ")):
                for word in line.removeprefix("ate-e2e: ").split():
                    key, eq, value = word.partition("=")
                    if eq:
                        found[key] = value
        return found

    def nodes(self) -> dict[str, str]:
        """``stat`` of each device node as the container sees it (or stat's error)."""
        prefix = "ate-e2e: node "
        lines = [line.removeprefix(prefix) for line in self.logs.splitlines() if line.startswith(prefix)]
        return {path: found for path, _, found in (line.partition(" ") for line in lines)}

    def devices_list(self) -> list[str]:
        """The container's device cgroup rules (cgroup v1 only; v2 has no such file)."""
        prefix = "ate-e2e: devices.list "
        return [line.removeprefix(prefix) for line in self.logs.splitlines() if line.startswith(prefix)]

    @property
    def marker(self) -> bool:
        return MARKER in self.logs.splitlines()

    @property
    def nic(self) -> str | None:
        """The guest's line naming the virtio device it found, if any."""
        found = NIC.search(self.logs)
        return found.group(0) if found else None

    @property
    def qemu_exit(self) -> int | None:
        code = self.facts().get("exit")
        return int(code) if code is not None else None

    @property
    def seconds(self) -> float | None:
        ms = self.facts().get("ms")
        return int(ms) / 1000 if ms is not None else None

    def booted(self) -> bool:
        """The guest ran to its end: marker, a virtio-net NIC, QEMU's exit code 67 (in the
        report and, once the container ended, as its exit code). How long QEMU took is
        not judged (a busy machine took 11.9 s where 3 s is usual; speed is bench/'s): a
        hung QEMU never reports its exit, and the pod waits that read the run time out."""
        nic = NIC.search(self.logs)
        return (
            self.marker
            and nic is not None
            and nic.group("device") == VIRTIO_NET
            and self.qemu_exit == BOOTED
            and self.exit_code in (None, BOOTED)
        )

    def summary(self) -> str:
        """One line for the run's record: node, uid, capabilities, cgroup, guest, QEMU."""
        f = self.facts()
        return (
            f"{self.node or '?'}: uid={f.get('uid')} CapEff={f.get('CapEff')} NoNewPrivs={f.get('NoNewPrivs')} "
            f"cgroup={f.get('cgroup')} | marker={self.marker} | {self.nic or 'no NIC line'} | "
            f"qemu exit={self.qemu_exit} in {self.seconds}s"
            + (f" | memory peak {int(f['peak']) / 2**20:.0f} MiB" if "peak" in f else "")
        )
