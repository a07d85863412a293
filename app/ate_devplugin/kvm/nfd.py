"""The facts as node labels in device-plugin mode: a node-feature-discovery feature file.

nfd-worker's ``local`` source reads every file in
``/etc/kubernetes/node-feature-discovery/features.d/`` (files whose name starts with a
dot aside; at most 64 KiB each), one ``<label>=<value>`` a line, and nfd-master puts them
on the Node. The daemon writes through a hostPath to that directory: it needs no API
rights of its own (the alternatives, patching the Node or writing NodeFeature objects,
would give every node's daemon write access to cluster objects). The same file also feeds
NodeFeatureRules, as ``local.label`` features.

Labels are the attribute names of attributes.py in the driver's domain
(``ate.dev/cpuModel=167``), plus one ``ate.dev/cpuid.<feature>=true`` per notable CPU
feature a guest would see. Values are made valid label values: at most 63 characters of
letters, digits, ``-``, ``_`` and ``.``, starting and ending with a letter or digit.
The file is replaced atomically (a dot-file renamed over it), so nfd-worker never reads
half of one.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from datetime import datetime

from ate_devplugin.kvm.attributes import Value, Version

FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
FILE_NAME = "ate-devplugin-kvm"
MAX_FILE_BYTES = 64 * 1024  # nfd-worker ignores a larger file
MAX_LABEL_VALUE = 63
_NOT_IN_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")
_EDGES = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")


def label_value(value: Value) -> str:
    """A valid label value for an attribute's value ("" when nothing of it is valid)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = value.text if isinstance(value, Version) else str(value)
    text = _NOT_IN_VALUE.sub("-", text)
    return _EDGES.sub("", _EDGES.sub("", text)[:MAX_LABEL_VALUE])


def labels(attributes: Mapping[str, Value], cpu_features: tuple[str, ...], domain: str) -> dict[str, str]:
    """The node labels of the attributes and the notable CPU features."""
    out = {f"{domain}/{name}": label_value(value) for name, value in attributes.items()}
    out.update({f"{domain}/cpuid.{feature}": "true" for feature in cpu_features})
    return {name: value for name, value in out.items() if value}


def render(node_labels: Mapping[str, str], expires: datetime | None = None) -> str:
    """The file's text. ``expires`` (aware) makes nfd-worker drop the labels after it, so
    a node whose daemon is gone stops claiming facts nobody checks any more."""
    head = ["# Written by ate-devplugin: this node's KVM facts (docs/kvm-health.md). Do not edit."]
    if expires is not None:
        head.append(f"# +expiry-time={expires.isoformat(timespec='seconds').replace('+00:00', 'Z')}")
    text = "\n".join([*head, *(f"{name}={value}" for name, value in sorted(node_labels.items()))]) + "\n"
    if len(text.encode()) > MAX_FILE_BYTES:
        raise ValueError(f"a feature file of {len(text.encode())} bytes: nfd-worker reads at most {MAX_FILE_BYTES}")
    return text


def write(directory: str, text: str, name: str = FILE_NAME) -> bool:
    """Replaces ``<directory>/<name>`` with ``text``; whether it changed (an equal file
    is left alone, so nfd-worker is not woken for nothing). Raises OSError."""
    path = os.path.join(directory, name)
    with contextlib.suppress(OSError), open(path, encoding="utf-8") as f:
        if f.read(MAX_FILE_BYTES + 1) == text:
            return False
    temp = os.path.join(directory, f".{name}.tmp")
    with open(temp, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(temp, 0o644)
    os.replace(temp, path)
    return True
