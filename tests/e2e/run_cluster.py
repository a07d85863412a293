"""A cluster of the end-to-end suite outside pytest, until SIGINT or SIGTERM: to look
around, and for the test that kills the process holding one (test_cluster.py).

    python3 -m tests.e2e.run_cluster --workdir /tmp/c --release 1.37 --runtime containerd2 --nodes 2 \\
        --cgroup 2 --image build/pause.tar

When the nodes are Ready it prints one JSON line: the sandbox's init PID (``nsenter -t
<pid> -m -n -p`` enters it), the admin kubeconfig, kubectl, and each node's name, init
PID and cgroup root. Root needed, the binaries as for the suite.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from tests.e2e.cluster import (
    CGROUP_VERSIONS,
    CONTAINERD2,
    DEFAULT_RELEASE,
    RELEASES,
    RUNTIMES,
    Cluster,
    containerd2_bin_dir,
    k8s_bin_dir,
)
from tests.e2e.sandbox import Sandbox


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.e2e.run_cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="where its files go (created)")
    parser.add_argument("--release", choices=RELEASES, default=DEFAULT_RELEASE)
    parser.add_argument("--runtime", choices=RUNTIMES, default=RUNTIMES[0])
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--cgroup", type=int, choices=CGROUP_VERSIONS, default=1, help="the nodes' cgroup version")
    parser.add_argument("--image", type=Path, action="append", default=[], help="an image archive every node imports")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwinds through the finally below, as Ctrl-C does
    args.workdir.mkdir(parents=True, exist_ok=True)
    sandbox = Sandbox(args.workdir / "logs")
    containerd2 = containerd2_bin_dir() if args.runtime == CONTAINERD2 else None
    cluster = Cluster(
        sandbox, args.workdir, k8s_bin_dir(), args.image, args.runtime, containerd2,
        release=args.release, nodes=args.nodes, cgroup=args.cgroup,
    )  # fmt: skip
    try:
        sandbox.start()
        cluster.up()
        print(json.dumps({
            "sandbox_pid": sandbox.init_pid, "kubeconfig": str(cluster.kubeconfig),
            "kubectl": str(cluster.kubectl_path),
            "nodes": [{"name": n.name, "init_pid": n.ns.init_pid if n.ns else 0, "cgroup_root": n.cgroup_root}
                      for n in cluster.nodes],
        }), flush=True)  # fmt: skip
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
