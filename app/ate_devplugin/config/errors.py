"""The one error of the config: a field and what is wrong with it, on one line."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration value is wrong; ``str()`` is one line naming field and problem."""

    def __init__(self, field_name: str, problem: str) -> None:
        # Names and values come from the file: escape what would break the one line.
        self.field_name = _printable(field_name)
        self.problem = _printable(problem)
        super().__init__(f"{self.field_name}: {self.problem}")


def _printable(text: str) -> str:
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def shown(value: Any) -> str:
    """A value as an error shows it: repr, cut short (a value may be megabytes)."""
    try:
        text = repr(value)
    except RecursionError:  # nested thousands deep
        return f"a deeply nested {type(value).__name__}"
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"
