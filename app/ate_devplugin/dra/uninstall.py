"""The chart's pre-delete hook in DRA mode (chart/templates/uninstall-hook.yaml): before
helm removes the release, delete its DaemonSets in the foreground and wait until they are
gone, so that each DRA driver pod stops while its ServiceAccount and RBAC still exist and
deletes its node's ResourceSlices itself.

Without it, helm deletes the ServiceAccount and the ClusterRoleBinding together with the
DaemonSet; the stopping driver's calls are then refused (401) and the node's slices stay
until the kubelet removes them, 30 s after the driver's registration went away, while the
scheduler still sees devices of a driver that is gone.

With the KVM prober in dra mode its DaemonSets go first (``--first``), and are waited for:
their pods hold claims that only a running driver can unprepare, so a prober pod deleted
after the drivers would never finish terminating.

    python3 -m ate_devplugin.dra.uninstall --namespace NS [--timeout SECONDS] [--first DAEMONSET]... DAEMONSET...

Exit codes: 0 when every DaemonSet is gone, and also when the wait ran out (said on
stderr: the uninstall goes on, and the kubelet removes what a pod that did not stop in time
left); 1 when the API server refused a call; 2 for bad arguments or no credentials.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

from lightkube import ApiError, Client
from lightkube.core.exceptions import ConfigError as ClientConfigError
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.types import CascadeType

NOT_FOUND = 404
POLL_S = 0.5


def log(message: str) -> None:
    print(f"ate-devplugin uninstall: {message}", file=sys.stderr, flush=True)


def exists(client: Client, namespace: str, name: str) -> bool:
    try:
        client.get(DaemonSet, name, namespace=namespace)
    except ApiError as exc:
        if exc.status.code == NOT_FOUND:
            return False
        raise
    return True


def stop_daemonsets(
    client: Client,
    namespace: str,
    names: Sequence[str],
    timeout_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Deletes each DaemonSet in the foreground (the API server keeps it until its pods are
    gone) and waits for them all; returns those still there when ``timeout_s`` ran out."""
    start = clock()
    for name in names:
        try:
            client.delete(DaemonSet, name, namespace=namespace, cascade=CascadeType.FOREGROUND)
        except ApiError as exc:
            if exc.status.code != NOT_FOUND:
                raise
        log(f"deleting daemonset {namespace}/{name} and its pods first")
    left = list(names)
    while True:
        left = [name for name in left if exists(client, namespace, name)]
        if not left or clock() - start >= timeout_s:
            break
        sleep(POLL_S)
    took = clock() - start
    if left:
        log(f"still there after {took:.1f}s: {', '.join(left)}; the uninstall goes on without them")
    else:
        log(f"gone after {took:.1f}s: {', '.join(names)}")
    return left


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python3 -m ate_devplugin.dra.uninstall", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--namespace", required=True, help="the release's namespace")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for all the DaemonSets to go")
    parser.add_argument(
        "--first",
        action="append",
        default=[],
        metavar="DAEMONSET",
        help="a DaemonSet deleted and waited for before the others (the KVM probers); repeatable",
    )
    parser.add_argument("daemonsets", nargs="+", metavar="DAEMONSET", help="the release's DaemonSets")
    return parser.parse_args(argv)


def main(
    argv: Sequence[str] | None = None,
    client: Client | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    args = parse(argv)
    try:
        client = client or Client()
        start = clock()
        if args.first:
            stop_daemonsets(client, args.namespace, args.first, args.timeout, clock=clock, sleep=sleep)
        left_s = max(0.0, args.timeout - (clock() - start))
        stop_daemonsets(client, args.namespace, args.daemonsets, left_s, clock=clock, sleep=sleep)
    except ClientConfigError as exc:
        log(f"no credentials for the API server: {exc}")
        return 2
    except ApiError as exc:
        log(f"the API server refused: {exc.status.code} {exc.status.message}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
