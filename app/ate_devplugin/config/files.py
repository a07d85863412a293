"""Reading the config file, bounded: a regular file of at most 1 MiB, never a blocking
open, and a YAML document of a bounded number of nodes (aliases counted expanded).

Everything here blocks and is safe to run in a worker thread.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import yaml

from ate_devplugin.config.checks import check_across, resources_from_document
from ate_devplugin.config.errors import ConfigError
from ate_devplugin.config.model import DEFAULT_RESOURCES, ResourceConfig

# A ConfigMap holds at most 1 MiB, and the largest valid config has far fewer YAML nodes
# (aliases counted expanded) than this.
MAX_CONFIG_BYTES = 1024 * 1024
MAX_YAML_NODES = 50_000
# A CPU profile or a Firecracker template is 4 levels deep; Python's decoder recurses, and
# a file of thousands of '[' ended in a RecursionError (a traceback, exit 1).
MAX_JSON_DEPTH = 32


def read_config_file(path: Path | str) -> bytes:
    """The file's bytes, if it resolves to a regular file of at most MAX_CONFIG_BYTES.

    A FIFO, a device or a directory is refused without being opened for reading data
    (a FIFO is opened non-blocking, a device never), so this never blocks.
    """
    where = str(path)
    try:
        st = os.stat(path)  # follows links: the ConfigMap's ..data swap keeps working
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(where, f"is not a regular file ({_kind(st.st_mode)})")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(where, _TOO_LARGE)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(where, f"cannot read: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)  # the file opened, which a rename may have changed since
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(where, f"is not a regular file ({_kind(st.st_mode)})")
        return read_bounded(fd, where)
    except OSError as exc:
        raise ConfigError(where, f"cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


def read_bounded(fd: int, where: str) -> bytes:
    """Everything up to the end of ``fd`` (a file, or a pipe like stdin), refused once past
    MAX_CONFIG_BYTES: no more than that and one byte is ever read."""
    chunks: list[bytes] = []
    size = 0
    try:
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(where, f"cannot read: {exc.strerror or exc}") from exc
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(where, _TOO_LARGE)
    return b"".join(chunks)


_TOO_LARGE = f"is larger than {MAX_CONFIG_BYTES} bytes (a ConfigMap holds at most 1 MiB)"


def _kind(mode: int) -> str:
    kinds = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device"}
    kinds |= {stat.S_ISBLK: "a block device", stat.S_ISSOCK: "a socket"}
    return next((name for test, name in kinds.items() if test(mode)), "not a file")


def read_json(path: Path | str) -> object:
    """A JSON file the commands read (a CPU profile, a template), bounded as the config file
    is and at most MAX_JSON_DEPTH deep; raises ConfigError naming the file and what is wrong."""
    where = str(path)
    data = read_config_file(path)  # missing, not a file, too large: said as such
    if not data.strip():
        raise ConfigError(where, "is empty: not JSON")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(where, "is not UTF-8 text: not JSON") from None
    if (depth := _json_depth(text)) > MAX_JSON_DEPTH:
        raise ConfigError(where, f"is nested {depth} deep: at most {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:  # the scan's count is the decoder's; this is a last guard
        raise ConfigError(where, f"is nested too deeply: at most {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, NaN, or an integer of more digits than Python converts
        said = "a number of thousands of digits" if "integer string conversion" in str(exc) else str(exc)
        raise ConfigError(where, f"not JSON: {said}") from None


# A string (to its end, or the text's: each character is looked at once) or a bracket.
_JSON_TOKENS = re.compile(r'"(?:[^"\\]++|\\.)*+"?|[\[\]{}]')


def _json_depth(text: str) -> int:
    """How deep the brackets outside strings nest (of text that may not be JSON at all)."""
    depth = deepest = 0
    for token in _JSON_TOKENS.findall(text):
        if token in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in ("]", "}"):
            depth = max(0, depth - 1)
    return deepest


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number JSON allows")


def load_resources(path: Path) -> tuple[ResourceConfig, ...]:
    """Read and validate a config file; raises ConfigError on any problem."""
    return decode_resources(read_config_file(path), str(path))


def decode_resources(data: bytes, source: str = "config") -> tuple[ResourceConfig, ...]:
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(source, _TOO_LARGE)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, "is not UTF-8 text") from exc
    try:
        return parse_resources(text)
    except MemoryError:
        raise ConfigError(source, "too large to load") from None


def parse_resources(text: str) -> tuple[ResourceConfig, ...]:
    try:
        _count_nodes(text)
        doc = yaml.load(text, Loader=_Loader)  # a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "document"
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(where, f"invalid YAML: {problem}") from exc
    except RecursionError as exc:
        raise ConfigError("document", "invalid YAML: nested too deeply") from exc
    except ConfigError:
        raise
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ConfigError("document", f"invalid YAML: {exc}") from exc
    return resources_from_document(doc)


# libyaml when PyYAML has it (the wheels do): about 20 times faster than pure Python.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _count_nodes(text: str) -> None:
    """Refuses a document of more than MAX_YAML_NODES nodes, each alias counted as the
    whole subtree it stands for, from the parser's events, before anything is built: a
    few hundred bytes of nested aliases cannot make a document of millions of nodes."""
    count = 0
    sizes: dict[str, int] = {}  # anchor -> nodes it stands for
    started: list[tuple[str | None, int]] = []  # open collections: anchor, count at start
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in started):
                raise ConfigError("document", "invalid YAML: an alias refers to a node that contains it")
            count += sizes.get(event.anchor or "", 1)  # an undefined one: the loader reports it
        elif isinstance(event, yaml.ScalarEvent):
            count += 1
            if event.anchor:
                sizes[event.anchor] = 1
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            started.append((event.anchor, count))
            count += 1
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, start = started.pop()
            if anchor:
                sizes[anchor] = count - start
        if count > MAX_YAML_NODES:
            raise ConfigError("document", f"more than {MAX_YAML_NODES} YAML nodes (aliases counted expanded)")


def load(path: Path | None, plugin_dir: str, socket_suffix: str = "") -> tuple[ResourceConfig, ...]:
    """The resources the daemon starts with: the file's (the default without one), checked
    against the plugin directory too (socket path lengths, with the sockets' suffix)."""
    if path is None:
        check_across(DEFAULT_RESOURCES, plugin_dir, socket_suffix)
        return DEFAULT_RESOURCES
    return decode(read_config_file(path), str(path), plugin_dir, socket_suffix)


def decode(data: bytes, source: str, plugin_dir: str, socket_suffix: str = "") -> tuple[ResourceConfig, ...]:
    """The resources of file content already read, checked against the plugin directory."""
    resources = decode_resources(data, source)
    check_across(resources, plugin_dir, socket_suffix)
    return resources


def read_again(
    path: Path, plugin_dir: str, previous: bytes | None, socket_suffix: str = ""
) -> tuple[bytes, tuple[ResourceConfig, ...] | ConfigError | None]:
    """The file's bytes and, unless they equal ``previous``, its resources or why they are
    rejected. Raises ConfigError when the file cannot be read."""
    data = read_config_file(path)
    if data == previous:
        return data, None
    try:
        return data, decode(data, str(path), plugin_dir, socket_suffix)
    except ConfigError as exc:
        return data, exc
