"""CDI (Container Device Interface) specs: how a CDI-aware runtime (containerd 2) learns
what a resource's device name stands for.

One spec file per resource, ``<cdi_dir>/<vendor>-<class>.json`` (``/var/run/cdi/ate.dev-kvm.json``):
kind = the resource name, one device named after the part after the slash (so the fully
qualified name is ``ate.dev/kvm=kvm``) carrying every present device node of the resource,
its mounts and its env. The runtime resolves the name the kubelet passes it (from Allocate's
``cdi_devices``, or from a DRA driver) against these files at container creation.

Files are replaced atomically (a temp file in the same directory, then rename): the
runtime never reads half a spec. The runtime reads only ``.json`` and ``.yaml`` files, so
the temp file (``.tmp``) is never taken for a spec.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ate_devplugin.host.watcher import FsEvent, Watches

if TYPE_CHECKING:
    from ate_devplugin.config import ResourceConfig
    from ate_devplugin.host.devices import DeviceNode, Discovery
    from ate_devplugin.observability.metrics import Metrics
    from ate_devplugin.tasks import Guard

log = logging.getLogger(__name__)

# Each spec says the lowest version its fields need: the runtime refuses a spec whose
# version is lower than that, and one newer than its own CDI library knows. Mount
# ``type`` came in 0.4.0, '.' in the class in 0.6.0; device nodes with uid, gid and
# fileMode were there from 0.3.0, the earliest version CDI libraries still load.
_BASE_VERSION = "0.3.0"
_MOUNT_TYPE_VERSION = "0.4.0"
_DOT_IN_CLASS_VERSION = "0.6.0"
SPEC_MODE = 0o644


def device_name(resource_name: str) -> str:
    """The CDI device of a resource: the part of its name after the slash."""
    return resource_name.rsplit("/", 1)[1]


def device_id(resource_name: str) -> str:
    """The fully qualified CDI device name, e.g. ``ate.dev/kvm=kvm``."""
    return f"{resource_name}={device_name(resource_name)}"


def spec_file_name(resource_name: str) -> str:
    """``<vendor>-<class>.json``. Two resources whose file names collide also collide in
    their socket names, which the config refuses."""
    return resource_name.replace("/", "-") + ".json"


def spec(resource: ResourceConfig, nodes: Sequence[DeviceNode]) -> dict[str, Any]:
    """The spec document of a resource with these device nodes present."""
    device_nodes = []
    for node in nodes:
        entry: dict[str, Any] = {
            "path": node.host_path,
            "type": "c",  # discovery keeps character devices only
            "major": node.major,
            "minor": node.minor,
            "permissions": resource.permissions,
        }
        # Unset: the runtime takes the host node's mode, and CDI makes the node the
        # container user's (when that user is not root).
        if resource.cdi_file_mode is not None:
            entry["fileMode"] = resource.cdi_file_mode
        if resource.cdi_uid is not None:
            entry["uid"] = resource.cdi_uid
        if resource.cdi_gid is not None:
            entry["gid"] = resource.cdi_gid
        device_nodes.append(entry)
    edits: dict[str, Any] = {"deviceNodes": device_nodes}
    if resource.mounts:
        edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "type": "bind",
                "options": ["rbind", "ro" if m.read_only else "rw"],
            }
            for m in resource.mounts
        ]
    if resource.env:
        edits["env"] = [f"{k}={v}" for k, v in resource.env.items()]
    name = device_name(resource.name)
    version = _BASE_VERSION
    if resource.mounts:
        version = _MOUNT_TYPE_VERSION
    if "." in name:
        version = _DOT_IN_CLASS_VERSION
    return {
        "cdiVersion": version,
        "kind": resource.name,
        "devices": [{"name": name, "containerEdits": edits}],
    }


class CdiSpecs:
    """Writes and removes the spec files of resources in one CDI directory.

    As a component, it keeps a spec for every resource that answers Allocate with CDI
    names (for every resource when ``every_resource``: a DRA driver answers with CDI names
    only), following the devices found, and removes them all when stopped: no runtime may
    resolve a name nobody serves.

    Writes only what changed: ``write`` with the same content again touches nothing.
    Failures are logged and counted (``ate_devplugin_cdi_spec_updates_total``), never
    raised: the next discovery tries again.
    """

    name = "CDI specs"

    def __init__(self, cdi_dir: str, metrics: Metrics | None = None, every_resource: bool = False) -> None:
        self.cdi_dir = cdi_dir
        self.metrics = metrics
        self.every_resource = every_resource
        self._written: dict[str, bytes] = {}  # resource name -> the content on disk
        self._resources: tuple[ResourceConfig, ...] = ()

    # --- the component --------------------------------------------------------------

    async def start(self, resources: tuple[ResourceConfig, ...], guard: Guard) -> None:
        self._resources = resources

    async def stop(self, deadline_s: float) -> list[str]:
        self.remove_all()
        return []

    def readiness(self) -> tuple[bool, str]:
        return True, ""

    def liveness(self) -> tuple[bool, str]:
        return True, ""

    def watches(self) -> Watches:
        return Watches()

    def on_fs_events(self, batch: Sequence[FsEvent]) -> None:
        pass

    async def on_resources(self, resources: tuple[ResourceConfig, ...]) -> None:
        self._resources = resources  # written at the discovery that follows

    def on_discovery(self, found: Mapping[str, Discovery]) -> None:
        wanted = {r.name for r in self._resources if self.every_resource or r.uses_cdi}
        for resource in self._resources:
            if resource.name in wanted:
                self.write(resource, found[resource.name].nodes)
        for name in self.resources - wanted:  # left the config, or no longer uses CDI
            self.remove(name)

    # --- the files ------------------------------------------------------------------

    @property
    def resources(self) -> set[str]:
        """The resources whose spec file this writer put in place."""
        return set(self._written)

    def path(self, resource_name: str) -> str:
        return os.path.join(self.cdi_dir, spec_file_name(resource_name))

    def write(self, resource: ResourceConfig, nodes: Sequence[DeviceNode]) -> bool:
        """Puts the resource's spec in place for these nodes; with no node present there
        is nothing to name (a CDI device needs edits), so the file goes. False on failure."""
        if not nodes:
            return self.remove(resource.name)
        content = json.dumps(spec(resource, nodes), indent=2).encode() + b"\n"
        if self._written.get(resource.name) == content:
            return True
        path = self.path(resource.name)
        try:
            os.makedirs(self.cdi_dir, mode=0o755, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".ate-devplugin-", suffix=".tmp", dir=self.cdi_dir)
            try:
                with os.fdopen(fd, "wb") as f:
                    os.fchmod(f.fileno(), SPEC_MODE)
                    f.write(content)
                    f.flush()
                    os.fsync(f.fileno())
                os.rename(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            self._count(resource.name, "write", "failure")
            log.error("cannot write the CDI spec %s: %s", path, exc, extra={"resource": resource.name})
            return False
        self._written[resource.name] = content
        self._count(resource.name, "write", "success")
        log.info(
            "CDI spec written",
            extra={"resource": resource.name, "path": path, "nodes": [n.host_path for n in nodes]},
        )
        return True

    def remove(self, resource_name: str) -> bool:
        """Removes the resource's spec file, if this writer put one there. False on failure."""
        if resource_name not in self._written:
            return True
        path = self.path(resource_name)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._count(resource_name, "remove", "failure")
            log.error("cannot remove the CDI spec %s: %s", path, exc, extra={"resource": resource_name})
            return False
        del self._written[resource_name]
        self._count(resource_name, "remove", "success")
        log.info("CDI spec removed", extra={"resource": resource_name, "path": path})
        return True

    def remove_all(self) -> bool:
        results = [self.remove(name) for name in sorted(self._written)]
        return all(results)

    def _count(self, resource_name: str, action: str, result: str) -> None:
        if self.metrics is not None:
            self.metrics.cdi_spec_updates.labels(resource_name, action, result).inc()
