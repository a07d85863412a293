"""Typed device attributes as a ResourceSlice holds them, within the API's limits.

Each attribute is ``{"<type>": value}`` with type ``bool``, ``int``, ``string`` or
``version``; a name without a domain is in the driver's domain (``cpuModel`` is
``ate.dev/cpuModel`` to a selector). The API server refuses a device with more than 32
attributes and capacities together, a name that is not a C identifier of at most 32
characters, or a string or version longer than 64 characters (k8s.io/api resource/v1):
these are checked here, before anything is written, so a slice is never refused for them.
List attributes (DRAListTypeAttributes) are alpha and off: none is written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ate_devplugin.kvm.attributes import Value, Version

MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_NAME = 32
MAX_VALUE = 64
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)


class InvalidAttributeError(ValueError):
    pass


def typed(value: Value) -> dict[str, Any]:
    """One attribute as the API spells it."""
    if isinstance(value, bool):  # before int: a bool is an int to Python
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, Version):
        if len(value.text) > MAX_VALUE or not _SEMVER.fullmatch(value.text):
            raise InvalidAttributeError(f"{value.text!r} is not a semantic version of at most {MAX_VALUE} characters")
        return {"version": value.text}
    return {"string": value[:MAX_VALUE]}


def to_json(attributes: Mapping[str, Value], capacities: int = 0) -> dict[str, dict[str, Any]]:
    """The attributes of one device that has ``capacities`` capacity entries; raises
    InvalidAttributeError on what the API server would refuse."""
    if len(attributes) + capacities > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise InvalidAttributeError(
            f"{len(attributes)} attributes and {capacities} capacities: "
            f"a device may have {MAX_ATTRIBUTES_AND_CAPACITIES}"
        )
    for name in attributes:
        if len(name) > MAX_NAME or not _C_IDENTIFIER.fullmatch(name):
            raise InvalidAttributeError(
                f"attribute name {name!r} is not a C identifier of at most {MAX_NAME} characters"
            )
    return {name: typed(value) for name, value in attributes.items()}
