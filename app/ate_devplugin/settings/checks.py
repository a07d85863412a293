"""One check per kind of value: the text given and the name it was given by (``--mode``,
``ATE_DEVPLUGIN_MODE``) in, the typed value out, or a ConfigError naming it."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ate_devplugin.config import MAX_ID, ConfigError

Check = Callable[[str, str], object]
SOCKET_SUFFIX = re.compile(r"([A-Za-z0-9][A-Za-z0-9-]{0,63})?")
MAX_SECONDS = 86400.0
MAX_SLOTS = 1024


@dataclass(frozen=True)
class OneOf:
    """One of a few words, given in any case."""

    choices: tuple[str, ...]

    def __call__(self, value: str, name: str) -> str:
        """The choice as the table spells it."""
        spelled = next((c for c in self.choices if c.lower() == value.lower()), None)
        if spelled is None:
            raise ConfigError(name, f"must be one of {', '.join(self.choices)} (got {value!r})")
        return spelled


@dataclass(frozen=True)
class OnOff:
    """A switch: on or off, in any case."""

    choices: tuple[str, ...] = ("on", "off")

    def __call__(self, value: str, name: str) -> bool:
        return OneOf(self.choices)(value, name) == "on"


def choices_of(check: object) -> tuple[str, ...]:
    """The words a check takes; () when it takes others."""
    return check.choices if isinstance(check, OneOf | OnOff) else ()


def text(value: str, name: str) -> str:
    return value


def file_or_none(value: str, name: str) -> Path | None:
    """A file named relative to the working directory; empty: none."""
    return Path(value).absolute() if value else None


def absolute_dir(value: str, name: str) -> str:
    if not value.startswith("/"):
        raise ConfigError(name, f"must be an absolute path (got {value!r})")
    return os.path.normpath(value)


def absolute_or_empty(value: str, name: str) -> str:
    return absolute_dir(value, name) if value else ""


def address(value: str, name: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(name, f"must be HOST:PORT with a port from 0 to 65535 (got {value!r})")
    return host.strip("[]") or "0.0.0.0", int(port)


def socket_suffix(value: str, name: str) -> str:
    if not SOCKET_SUFFIX.fullmatch(value):
        raise ConfigError(name, f"must be up to 64 letters, digits and '-', not starting with '-' (got {value!r})")
    return value


def user_id(value: str, name: str) -> int:
    """A uid or gid (the largest, 2^32-1, is the kernel's "none")."""
    if not value.isdigit() or not 0 <= int(value) < MAX_ID:
        raise ConfigError(name, f"must be a user or group id from 0 to {MAX_ID - 1} (got {value!r})")
    return int(value)


def slots(value: str, name: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= MAX_SLOTS:
        raise ConfigError(name, f"must be an integer from 1 to {MAX_SLOTS} (got {value!r})")
    return int(value)


def seconds(value: str, name: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 <= number <= MAX_SECONDS:  # also refuses nan
        raise ConfigError(name, f"must be a number of seconds from 0 to {MAX_SECONDS:.0f} (got {value!r})")
    return number


def positive_seconds(value: str, name: str) -> float:
    number = seconds(value, name)
    if number == 0:
        raise ConfigError(name, f"must be a number of seconds above 0, at most {MAX_SECONDS:.0f} (got {value!r})")
    return number
