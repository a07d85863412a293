"""A directory only the daemon controls, for a socket whose peers are told apart by it (the
KVM prober's: kvmhealth/link.py).

Made by the daemon when absent; when present it must be a real directory (not a symlink,
which would put the socket wherever it points) owned by the daemon's uid (another owner
could swap the socket for its own). Its mode is set through the opened directory, never
through a path a symlink could redirect. Anything else is refused at start with one line
naming what to remove: the daemon cannot tell a stale leftover from an attack, a person can.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat


class SocketDirError(OSError):
    """The directory cannot be made the daemon's own: what is wrong and what to remove."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def own_directory(path: str, mode: int, uid: int | None = None) -> bool:
    """Makes ``path`` a directory of ``uid`` (the daemon's) with ``mode``; whether its mode
    had to be changed. Raises SocketDirError."""
    uid = os.geteuid() if uid is None else uid
    parent = os.path.dirname(path.rstrip("/")) or "."
    os.makedirs(parent, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)  # the umask may take bits away: set below
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):  # what O_NOFOLLOW and O_DIRECTORY refuse
            raise
        made = "the daemon makes the directory itself"
        raise SocketDirError(f"{path} is {_kind(path)}, not a directory: remove it (rm {path}); {made}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != uid:
            raise SocketDirError(
                f"{path} is owned by uid {st.st_uid}, not the daemon's uid {uid}: remove it (rm -r {path}); "
                "the daemon makes the directory itself"
            )
        if stat.S_IMODE(st.st_mode) == mode:
            return False
        os.fchmod(fd, mode)
        return True
    finally:
        os.close(fd)


def _kind(path: str) -> str:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "not a directory"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"
