"""Reading the file, bounded: unreadable files, alias bombs, only a regular file of bounded size."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ate_devplugin.config import (
    MAX_CONFIG_BYTES,
    ConfigError,
    parse_resources,
    read_bounded,
    read_config_file,
)

MINIMAL = "resources:\n  - name: ate.dev/kvm\n    devices: [/dev/kvm]\n"


def test_unreadable_file(tmp_path: Path) -> None:
    from ate_devplugin.config import load_resources

    with pytest.raises(ConfigError, match="cannot read"):
        load_resources(tmp_path / "missing.yaml")


BOMB = "".join(f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 10 if n else ['x'] * 10)}]\n" for n in range(9))


def test_a_yaml_alias_bomb_is_refused_while_composing() -> None:
    assert len(BOMB) < 600
    with pytest.raises(ConfigError, match=r"^document: more than 50000 YAML nodes"):
        parse_resources(BOMB + "resources: [*l8]\n")


def test_aliases_within_the_cap_and_a_recursive_one() -> None:
    shared = parse_resources("resources: [{name: a.b/c, devices: &d [/dev/kvm]}, {name: a.b/d, devices: *d}]\n")
    assert [r.devices for r in shared] == [("/dev/kvm",), ("/dev/kvm",)]
    with pytest.raises(ConfigError, match=r"^document: invalid YAML: an alias refers to a node that contains it"):
        parse_resources("resources: &r [*r]\n")


def test_only_a_regular_file_of_bounded_size_is_read(tmp_path: Path) -> None:
    good = tmp_path / "data" / "config.yaml"
    good.parent.mkdir()
    good.write_text(MINIMAL)
    (tmp_path / "..data").symlink_to("data")  # as a ConfigMap volume lays it out
    (tmp_path / "config.yaml").symlink_to("..data/config.yaml")
    assert read_config_file(tmp_path / "config.yaml") == MINIMAL.encode()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as f:
        f.truncate(50 * 1024 * 1024)  # sparse: costs no disk
    edge = tmp_path / "edge.yaml"
    edge.write_bytes(b"#" * MAX_CONFIG_BYTES)
    assert len(read_config_file(edge)) == MAX_CONFIG_BYTES
    edge.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    for path, words in [
        (fifo, "is not a regular file (a FIFO)"),
        (Path("/dev/zero"), "is not a regular file (a character device)"),
        (tmp_path, "is not a regular file (a directory)"),
        (huge, "is larger than 1048576 bytes"),
        (edge, "is larger than 1048576 bytes"),
        (tmp_path / "absent", "cannot read: No such file or directory"),
    ]:
        with pytest.raises(ConfigError) as info:
            read_config_file(path)
        assert str(info.value) == f"{path}: {words}" or str(info.value).startswith(f"{path}: {words}"), info.value


def _pipe_of(data: bytes) -> int:
    """The read end of a pipe a thread fills with ``data`` (then closes, or stops on EPIPE)."""
    read, write = os.pipe()

    def fill() -> None:
        try:
            with os.fdopen(write, "wb") as f:
                f.write(data)
        except BrokenPipeError:
            pass  # the reader stopped, as it should past the bound

    threading.Thread(target=fill, daemon=True).start()
    return read


@pytest.mark.parametrize("size", [0, 100, MAX_CONFIG_BYTES])
def test_a_pipe_is_read_to_its_end_within_the_bound(size: int) -> None:
    fd = _pipe_of(b"#" * size)
    try:
        assert read_bounded(fd, "stdin") == b"#" * size
    finally:
        os.close(fd)


def test_a_pipe_past_the_bound_is_refused_having_read_one_byte_more() -> None:
    fd = _pipe_of(b"#" * (MAX_CONFIG_BYTES * 3))
    try:
        with pytest.raises(ConfigError, match=r"^stdin: is larger than 1048576 bytes"):
            read_bounded(fd, "stdin")
        # What is left in the pipe: all but the bound and one byte were never read.
        left = b""
        while chunk := os.read(fd, 1 << 20):
            left += chunk
        assert len(left) == MAX_CONFIG_BYTES * 3 - (MAX_CONFIG_BYTES + 1)
    finally:
        os.close(fd)
