"""Unix sockets: a socket's identity, and the one gRPC server on a unix socket."""

import os
import socket
import time
from pathlib import Path

import grpc
import pytest

from ate_devplugin.host.sockets import ServeError, UnixServer, socket_identity


def bind(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return s


def test_socket_bound_again_under_the_same_name_is_another_socket(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    assert socket_identity(str(path)) is None
    first = bind(path)
    before = socket_identity(str(path))
    first.close()
    os.unlink(path)
    time.sleep(0.02)  # a kubelet restart takes far longer than the filesystem's clock tick
    second = bind(path)
    try:
        # The inode number may well be reused (ext4 does); the identity must still differ.
        assert socket_identity(str(path)) not in (None, before)
    finally:
        second.close()


def no_services(server: grpc.aio.Server) -> None:
    pass


async def test_a_server_replaces_a_stale_file_and_its_socket_goes_with_it(tmp_path: Path) -> None:
    path = tmp_path / "p.sock"
    path.write_text("left by an earlier instance")
    server = UnixServer(str(path), no_services)
    await server.start()
    assert server.socket_intact()
    assert os.stat(path).st_mode & 0o777 == 0o600
    os.chmod(path, 0o600)  # a mode change is no new socket
    assert server.socket_intact()
    await server.stop(0)
    assert not path.exists()
    assert not server.socket_intact()


async def test_a_socket_that_cannot_be_served_says_where(tmp_path: Path) -> None:
    server = UnixServer(str(tmp_path / "missing" / "p.sock"), no_services)
    with pytest.raises(ServeError, match=r"cannot serve on .*missing/p\.sock"):
        await server.start()
    await server.stop(0)  # never started: nothing to do
