"""The config's one error: every problem found, each a field and what is wrong with it."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

# A file can hold thousands of wrong values; this many are shown, then how many more.
MAX_PROBLEMS = 20
EXIT_CONFIG = 2  # every command's exit code for a bad configuration or usage


@dataclass(frozen=True)
class Problem:
    """One wrong (or, as a warning, idle) value: its field, what is wrong, and a hint for
    the common mistakes. ``str()`` is one line."""

    field: str
    text: str
    hint: str = ""

    def __post_init__(self) -> None:
        # Names and values come from the file: escape what would break the one line.
        for name in ("field", "text", "hint"):
            object.__setattr__(self, name, _printable(getattr(self, name)))

    def __str__(self) -> str:
        return f"{self.field}: {self.text}" + (f" (hint: {self.hint})" if self.hint else "")


class ConfigError(ValueError):
    """A configuration value is wrong; ``problems`` are all that were found, each naming
    its field, and ``str()`` says them on one line."""

    def __init__(self, field_name: str, problem: str, hint: str = "") -> None:
        self.problems: tuple[Problem, ...] = (Problem(field_name, problem, hint),)
        self.omitted = 0  # problems found beyond MAX_PROBLEMS
        super().__init__(str(self.problems[0]))

    @classmethod
    def of(cls, problems: Sequence[Problem], omitted: int = 0) -> ConfigError:
        """One error of several problems (at least one), at most MAX_PROBLEMS kept."""
        first = problems[0]
        error = cls(first.field, first.text, first.hint)
        error.problems = tuple(problems[:MAX_PROBLEMS])
        error.omitted = omitted + max(0, len(problems) - MAX_PROBLEMS)
        error.args = (str(error),)
        return error

    @property
    def problem(self) -> str:
        return self.problems[0].text

    def lines(self) -> list[str]:
        """One line per problem, for the command line."""
        lines = [str(p) for p in self.problems]
        if self.omitted:
            lines.append(f"config: {self.omitted} more problems not shown")
        return lines

    def __str__(self) -> str:
        return "; ".join(self.lines())


class Problems:
    """Collects what checks find, so that one run reports every problem, not the first.

    ``with problems.gathered(): ...`` keeps a ConfigError raised inside and goes on;
    :meth:`raise_any` raises them all as one.
    """

    def __init__(self) -> None:
        self.found: list[Problem] = []
        self.omitted = 0

    def add(self, error: ConfigError) -> None:
        self.found.extend(error.problems)
        self.omitted += error.omitted

    def gathered(self) -> _Gathered:
        return _Gathered(self)

    def raise_any(self) -> None:
        if self.found:
            raise ConfigError.of(self.found, self.omitted)


class _Gathered:
    def __init__(self, problems: Problems) -> None:
        self.problems = problems

    def __enter__(self) -> None:
        return None

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> bool:
        if isinstance(e, ConfigError):
            self.problems.add(e)
            return True
        return False


def _printable(text: str) -> str:
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def shown(value: Any) -> str:
    """A value as an error shows it: repr, cut short (a value may be megabytes)."""
    try:
        text = repr(value)
    except RecursionError:  # nested thousands deep
        return f"a deeply nested {type(value).__name__}"
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"


def config_error(exc: ConfigError) -> int:
    """Says every problem on a line of its own, before anything started; the exit code."""
    for line in exc.lines():
        print(f"ate-devplugin: config error: {line}", file=sys.stderr)
    return EXIT_CONFIG
