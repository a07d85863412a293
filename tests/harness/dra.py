"""The kubelet's side of the DRA driver's sockets, played by a test: registration and prepare.

The sockets are reached through the namespace's root (``Namespace.path``), so the test
process calls them from outside the mount namespace the daemon runs in.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from ate_devplugin.api.dra.v1 import api_pb2 as dra
from ate_devplugin.api.dra.v1 import api_pb2_grpc as dra_grpc
from ate_devplugin.api.pluginregistration.v1 import api_pb2 as reg
from ate_devplugin.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from tests.harness.kubelet import Namespace

REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DRA_DIR = "/var/lib/kubelet/plugins/ate.dev"
DAEMON_ARGS = ("--registry-dir", REGISTRY_DIR, "--dra-dir", DRA_DIR)

Claim = tuple[str, str, str]  # namespace, name, uid


def prepare(ns: Namespace, claims: Sequence[Claim], timeout: float = 60) -> dict[str, str]:
    """NodePrepareResources (v1) as the kubelet calls it: each UID's error ('' = prepared)."""
    with grpc.insecure_channel(f"unix://{ns.path(f'{DRA_DIR}/dra.sock')}") as channel:
        stub = dra_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
        request = dra.NodePrepareResourcesRequest(
            claims=[dra.Claim(namespace=n, name=name, uid=uid) for n, name, uid in claims]
        )
        response = stub.NodePrepareResources(request, timeout=timeout)
    return {uid: answer.error for uid, answer in response.claims.items()}


def register(ns: Namespace, ok: bool = True, error: str = "") -> None:
    """What the kubelet's plugin watcher does with a new registration socket."""
    with grpc.insecure_channel(f"unix://{ns.path(f'{REGISTRY_DIR}/ate.dev-reg.sock')}") as channel:
        stub = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        stub.GetInfo(reg.InfoRequest(), timeout=10)
        stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=ok, error=error), timeout=10)
