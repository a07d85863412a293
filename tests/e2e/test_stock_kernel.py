"""The guest users run where KVM is hardware: a stock Linux kernel. docs/examples/
microvm-stock-kernel.sh builds Debian's cloud kernel and a busybox initramfs whose /init
prints a marker and reboots; the VMM image with both boots it with QEMU's ``microvm``
machine in the worker pod (uid 10001, no capability, ``ate.dev/kvm: 1``) on the 1.37
cluster (cgroup v2), QEMU exiting 0 when the guest reboots.

On a software KVM such as these machines' (PVM: no vmx or svm flag, kvm_pvm loaded) a
stock kernel does not boot (docs/microvm-workers.md): the test says so in the run's
output and is skipped, under CI too (tests/harness/require.py, not_this_kind_of_machine).
It is not the suite's only proof: every device path boots the multiboot guest
(tests/e2e/vmm.py) on these machines.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.clusters import Clusters
from tests.e2e.userpath import RESOURCE, TUN, Helm, run_pod, worker
from tests.e2e.vmm import kvm_kind
from tests.harness.image import buildah
from tests.harness.require import not_this_kind_of_machine

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "docs" / "examples" / "microvm-stock-kernel.sh"
LINUX_IMAGE = "localhost/ate-e2e-vmm-linux:e2e"
# The command docs/examples/microvm-stock-kernel.sh prints, with the image's paths.
QEMU = ["qemu-system-x86_64", "-M", "microvm,x-option-roms=off,rtc=on", "-accel", "kvm", "-cpu", "host",
        "-m", "256M", "-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-no-reboot",
        "-kernel", "/opt/microvm/vmlinuz", "-initrd", "/opt/microvm/initrd.gz",
        "-append", "console=ttyS0 reboot=t panic=-1"]  # fmt: skip
MARKER = re.compile(r"ate guest: Linux \S+-cloud-amd64 booted")


def linux_image(vmm_archive: Path, workdir: Path) -> Path:
    """The VMM image with the script's kernel and initramfs at /opt/microvm, as an archive."""
    built = subprocess.run(["sh", str(SCRIPT), str(workdir / "guest")], capture_output=True, text=True,
                           timeout=900, check=False)  # fmt: skip
    assert built.returncode == 0, built.stderr
    print(built.stdout)
    container = buildah("from", f"docker-archive:{vmm_archive}").stdout.strip()
    try:
        for name in ("vmlinuz", "initrd.gz"):
            buildah("copy", "--chmod", "0644", container, str(workdir / "guest" / name), f"/opt/microvm/{name}")
        buildah("commit", "--quiet", container, LINUX_IMAGE, timeout=600)
    finally:
        buildah("rm", container, check=False)
    archive = workdir / "vmm-linux.tar"
    try:
        buildah("push", "--quiet", LINUX_IMAGE, f"docker-archive:{archive}:{LINUX_IMAGE}", timeout=600)
    finally:
        buildah("rmi", LINUX_IMAGE, check=False)
    return archive


def test_the_debian_cloud_kernel_boots_in_an_unprivileged_pod(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    kind, why = kvm_kind()
    if kind != "hardware":
        not_this_kind_of_machine(f"a stock Linux guest needs hardware KVM; here {why}", capsys)
    clusters: Clusters = request.getfixturevalue("clusters")
    cluster = request.getfixturevalue("cluster_137")
    helm: Helm = request.getfixturevalue("helm_137")
    archive = linux_image(clusters.vmm_image(), tmp_path)
    for node in cluster.nodes:
        node.ctr("images", "import", str(archive), timeout=600)
    pod = worker("stock-kernel", node=cluster.node)
    del pod["spec"]["initContainers"]
    (vmm,) = pod["spec"]["containers"]
    vmm["image"] = LINUX_IMAGE
    vmm["command"] = [*vmm["command"][:4], *QEMU]  # REPORT around QEMU, as for every worker
    del vmm["resources"]["limits"][TUN]
    helm.install()
    try:
        cluster.node.wait_resource(RESOURCE, "4096")
        run = run_pod(cluster, pod, timeout=300)
    finally:
        helm.uninstall()
    print(f"stock kernel: {run.summary()}\n{run.logs}")
    assert MARKER.search(run.logs), run.logs
    assert (run.qemu_exit, run.exit_code) == (0, 0), run.logs
    assert (run.facts()["uid"], run.facts()["CapEff"]) == ("10001", "0000000000000000")
