"""Unix sockets: telling one socket file from a later one, and a gRPC server on one.

:class:`UnixServer` serves every unix socket of the daemon (one per device-plugin
resource, and the DRA driver's service and registration sockets): made with mode 0600
from the start (only root, the kubelet, may call), removed first on stop so that nobody
new connects, and stopped within a bound even when a client stopped reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import Callable, Sequence

import grpc

log = logging.getLogger(__name__)

# Only the kubelet (root) may call us: Allocate hands out device nodes.
SOCKET_MODE = 0o600

# (st_dev, st_ino, st_mtime_ns) of a socket file.
SocketId = tuple[int, int, int]


class ServeError(Exception):
    pass


def socket_identity(path: str) -> SocketId | None:
    """Tells one socket file from a later one of the same name; None unless a socket is there.

    Not followed through symlinks: a symlink (or a file) renamed over a socket is not it.
    The modification time is part of it because some filesystems (ext4) give a socket
    bound again right after an unlink the same inode number; unlike the change time, it
    stays put when the socket's mode or owner changes.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


class UnixServer:
    """A gRPC server on one unix socket; ``start`` again after ``stop`` makes a new one.
    ``add_services`` adds the services to each server made (a generated ``add_*_to_server``);
    ``options`` are its gRPC channel arguments (a receive limit, say)."""

    def __init__(
        self,
        socket_path: str,
        add_services: Callable[[grpc.aio.Server], None],
        stop_margin: float = 0.5,
        options: Sequence[tuple[str, int]] = (),
    ) -> None:
        self.socket_path = socket_path
        self.add_services = add_services
        self.stop_margin = stop_margin
        self.options = tuple(options)
        self._server: grpc.aio.Server | None = None
        self._identity: SocketId | None = None

    async def start(self) -> None:
        """Raises ServeError, naming the socket and why."""
        server = grpc.aio.server(options=self.options)
        self.add_services(server)
        try:
            _bind(server, self.socket_path)
            await server.start()
            os.chmod(self.socket_path, SOCKET_MODE)
        except Exception as exc:
            await server.stop(None)
            raise ServeError(f"cannot serve on {self.socket_path}: {exc}") from exc
        self._server = server
        self._identity = socket_identity(self.socket_path)

    def socket_intact(self) -> bool:
        """Whether the socket file on disk is still the one this server created."""
        return self._identity is not None and socket_identity(self.socket_path) == self._identity

    async def stop(self, grace: float | None) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        intact = self.socket_intact()
        self._identity = None
        if intact:
            # First, so the kubelet sees the socket go and nobody new connects.
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
            except OSError as exc:  # e.g. the directory turned read-only
                log.warning("cannot remove %s: %s", self.socket_path, exc)
        # A client that stopped reading keeps a write pending for ever, and gRPC then
        # never completes its shutdown: stop waiting shortly after the grace period.
        # (asyncio.wait, not wait_for: it never swallows a cancellation of ours.)
        stopping = asyncio.ensure_future(server.stop(grace))
        stopping.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, not raised
        done, _ = await asyncio.wait({stopping}, timeout=(grace or 0.0) + self.stop_margin)
        if not done:
            log.warning("gRPC server on %s did not stop in time: a client is not reading", self.socket_path)


def _bind(server: grpc.aio.Server, path: str) -> None:
    """Binds ``server`` to the unix socket ``path``, made with SOCKET_MODE from the start.

    A socket left by an earlier instance (killed before it could clean up) would make the
    bind fail; nobody else may own our socket's name. The socket gets the mode the umask
    leaves, so the umask is narrowed around the bind.
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    umask = os.umask(0o777 & ~SOCKET_MODE)
    try:
        server.add_insecure_port(f"unix:{path}")
    finally:
        os.umask(umask)
