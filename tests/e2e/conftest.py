"""Fixtures of the end-to-end suite: real clusters, and the user's helm.

``clusters`` brings up each kind of cluster (release ``1.35`` or ``1.37``, runtime
Debian's containerd 1.6 or containerd 2, number of nodes, cgroup version) the first time a
test asks for it, and keeps it for every later test of the run: ``clusters.get("1.37",
CONTAINERD2, nodes=2, cgroup=2)``. Package-scoped: they all end after the last test of tests/e2e, so the test
folders after it do not share the machine with idle clusters. The named fixtures are the kinds the modules use:

* ``cluster``: 1.35, containerd 1.6, one node on cgroup v1 (``helm``);
* ``cluster_containerd2``: 1.35, containerd 2 (CDI), one node on cgroup v2 (``helm_containerd2``);
* ``cluster_137``: 1.37, containerd 2, two nodes on cgroup v2 (``helm_137``).

cgroup v1 is kept for one kind so that both are shown; docs/e2e-nodes.md says what a v2
node here is and which kubelet settings it runs with.

Each cluster gets three images as archives (the project's image from the session's
``image`` fixture, shared with tests/image; the pause image; the VMM image of
tests/e2e/vmm.py, built once), a :class:`Sandbox` and the :class:`Cluster` in it.
Everything ends in every outcome: on failure, on Ctrl-C (pytest runs fixture finalizers)
and, through PR_SET_PDEATHSIG, even when the test process is killed (test_cluster.py kills
one). After each cluster is gone, and again after the last one, it
checks that the host is as it was: no /var/lib/kubelet, /run/containerd,
/var/log/containers, ... that was not there before, none of the clusters' links or tmpfs
mounts in the host's namespaces, no process of the cluster left, no cgroup of any node.

Needs root, util-linux (unshare, nsenter), /dev/kvm, Debian's containerd, runc,
etcd-server, containernetworking-plugins and binutils (tools/setup.sh test installs them),
the Kubernetes binaries of the release (tools/build-k8s.sh), helm v3 and v4
(tools/build-helm.sh), for containerd 2 tools/build-containerd.sh, for the user path's
registry (tests/e2e/registry.py) Debian's docker-registry, and Debian's archive reachable
(the VMM image installs qemu-system-x86 with apt-get). What is missing skips the
tests that need it, or fails them when ``CI=true`` or ``E2E_REQUIRED=1``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.cluster import CONTAINERD2, DEBIAN_CONTAINERD, Cluster
from tests.e2e.clusters import Clusters
from tests.e2e.userpath import Helm, make_helm
from tests.harness.image import BuiltImage


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "every_release: a user-path test that runs on the 1.37 cluster too")


@pytest.fixture(scope="package")
def clusters(image: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    factory = Clusters(image, tmp_path_factory)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="package")
def cluster(clusters: Clusters) -> Cluster:
    return clusters.get("1.35", DEBIAN_CONTAINERD, nodes=1, cgroup=1)


@pytest.fixture(scope="package")
def cluster_containerd2(clusters: Clusters) -> Cluster:
    """The one-node 1.35 cluster on containerd 2 and cgroup v2: CDI specs in its /var/run/cdi are used."""
    return clusters.get("1.35", CONTAINERD2, nodes=1, cgroup=2)


@pytest.fixture(scope="package")
def cluster_137(clusters: Clusters) -> Cluster:
    """Two nodes of Kubernetes 1.37 on containerd 2 and cgroup v2 (DRAExtendedResource GA,
    DRAConsumableCapacity and ResourceHealthStatus beta and on, their defaults)."""
    return clusters.get("1.37", CONTAINERD2, nodes=2, cgroup=2)


@pytest.fixture(scope="package")
def helm(cluster: Cluster) -> Helm:
    """helm v3: the one the scenarios after the install use."""
    return make_helm("v3", cluster)


@pytest.fixture(scope="package")
def helm_containerd2(cluster_containerd2: Cluster) -> Helm:
    """helm v3 on the containerd 2 cluster."""
    return make_helm("v3", cluster_containerd2)


@pytest.fixture(scope="package")
def helm_137(cluster_137: Cluster) -> Helm:
    """helm v3 on the two-node 1.37 cluster."""
    return make_helm("v3", cluster_137)
