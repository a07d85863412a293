import os
import socket
import time
from pathlib import Path

from ate_devplugin.host.sockets import socket_identity


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
