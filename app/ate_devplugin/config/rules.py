"""The rule language of the config file: each rule checks a value and says the same in JSON Schema.

A rule's ``check`` turns a raw YAML value into a checked one or raises ConfigError naming
the field; a mapping or a list checks every part before it raises, so the error holds
every problem, with a hint where the value looks like a common mistake. Its ``schema`` is
the same rule for the chart's values.schema.json, so the two cannot drift
(tools/gen-config-schema.py writes it).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from ate_devplugin.config.errors import MAX_PROBLEMS, ConfigError, Problems, shown

# Hints for what YAML makes of a value written without quotes or left out.
_EMPTY = "nothing follows the colon, and YAML reads that as null"
_BOOLEAN = "YAML reads an unquoted yes, no, on, off, true or false as a boolean: write it in quotes"

# A "did you mean" compares the word with every known name (difflib): tens of thousands of
# wrong names took a minute, and no more than MAX_PROBLEMS problems are ever shown. So the
# outermost check of a value (a whole file) suggests for its first MAX_HINTS wrong words only.
MAX_HINTS = MAX_PROBLEMS
_hints_left: ContextVar[list[int] | None] = ContextVar("hints_left", default=None)


@contextmanager
def _hint_budget() -> Iterator[None]:
    """Opens the budget of hints when no check around this one did."""
    if _hints_left.get() is not None:
        yield
        return
    token = _hints_left.set([MAX_HINTS])
    try:
        yield
    finally:
        _hints_left.reset(token)


@dataclass(frozen=True)
class Pattern:
    """The whole string must match ``regex`` (or must not, when ``negate``).

    The regex is written in the common part of Python's re and Go's RE2 (helm's
    validator); the schema anchors it with ^(?:...)$, which in RE2 is the whole text.
    """

    regex: str
    problem: str
    negate: bool = False

    def holds(self, text: str) -> bool:
        return (re.fullmatch(self.regex, text) is None) is self.negate

    def schema(self) -> dict[str, Any]:
        match = {"pattern": f"^(?:{self.regex})$"}
        # A number matches no pattern, so "not" must say "a string that matches".
        return {"not": {"type": "string", **match}} if self.negate else match


@dataclass(frozen=True)
class Text:
    patterns: tuple[Pattern, ...]
    max_chars: int
    description: str = ""
    numbers: bool = False  # a number is taken as its text (env values)
    choices: tuple[str, ...] = ()  # the only values (for the hint; the patterns say it)
    noun: str = ""  # with it, ``choices`` are the only values: "unknown <noun> 'x' (expected a or b)"

    def check(self, raw: Any, where: str) -> str:
        if self.numbers and isinstance(raw, (int, float)) and not isinstance(raw, bool):
            if not math.isfinite(raw):
                raise ConfigError(where, f"must be a string or a finite number (got {shown(raw)})")
            try:
                raw = str(raw)
            except ValueError:  # more digits than Python converts: far too long anyway
                raise ConfigError(where, f"must be at most {self.max_chars} characters") from None
        if not isinstance(raw, str):
            kind = "a string or a number" if self.numbers else "a string"
            raise ConfigError(where, f"must be {kind} (got {shown(raw)})", self._unquoted(raw))
        if self.noun and raw not in self.choices:  # a wrong choice, not one too many characters
            raise ConfigError(where, self._not_a_choice(raw), _near(raw, self.choices))
        if len(raw) > self.max_chars:
            raise ConfigError(where, f"must be at most {self.max_chars} characters (got {len(raw)})")
        for p in self.patterns:
            if not p.holds(raw):
                raise ConfigError(where, f"{p.problem} (got {shown(raw)})", _near(raw, self.choices))
        return raw

    def _not_a_choice(self, raw: str) -> str:
        *first, last = self.choices
        return f"unknown {self.noun} {shown(raw)} (expected {', '.join(first)} or {last})"

    def _fits(self, text: str) -> bool:
        return len(text) <= self.max_chars and all(p.holds(text) for p in self.patterns)

    def _unquoted(self, raw: Any) -> str:
        """What YAML made of a string written without quotes, and how to write it."""
        if raw is None:
            return _EMPTY
        if isinstance(raw, bool):
            return _BOOLEAN
        if isinstance(raw, int) and raw >= 0:
            if self._fits(octal := f"0{raw:o}"):  # file_mode: 0666 is read as 438
                return f"YAML reads an unquoted {octal} as the octal number {raw}: write '{octal}', in quotes"
            if self._fits(str(raw)):
                return f"write it in quotes: '{raw}'"
        return ""

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": ["string", "number"] if self.numbers else "string"}
        if self.description:
            out["description"] = self.description
        out["maxLength"] = self.max_chars
        rules = [p.schema() for p in self.patterns]
        if len(rules) == 1:
            out.update(rules[0])
        elif rules:
            out["allOf"] = rules
        return out


@dataclass(frozen=True)
class Integer:
    minimum: int
    description: str = ""
    maximum: int | None = None

    def check(self, raw: Any, where: str) -> int:
        # An integral float is the same number (helm cannot tell 8 from 8.0 either).
        if isinstance(raw, float) and raw.is_integer():
            raw = int(raw)
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < self.minimum:
            raise ConfigError(where, f"must be {self._kind()} (got {shown(raw)})", _number_hint(raw))
        if self.maximum is not None and raw > self.maximum:
            raise ConfigError(where, f"must be {self._kind()} (got {shown(raw)})")
        return raw

    def _kind(self) -> str:
        if self.maximum is not None:
            return f"an integer from {self.minimum} to {self.maximum}"
        return "a positive integer"

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "integer", "minimum": self.minimum}
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True)
class Flag:
    description: str = ""

    def check(self, raw: Any, where: str) -> bool:
        if not isinstance(raw, bool):
            quoted = isinstance(raw, str) and raw.lower() in ("true", "false", "yes", "no", "on", "off")
            hint = _EMPTY if raw is None else "write true or false, without quotes" if quoted else ""
            raise ConfigError(where, f"must be true or false (got {shown(raw)})", hint)
        return raw

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "boolean"}
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True)
class Items:
    item: Rule
    max_items: int
    min_items: int = 0
    unique: bool = False
    description: str = ""
    one_as_list: bool = False  # a single string stands for a list of one

    def check(self, raw: Any, where: str) -> list[Any]:
        with _hint_budget():
            return self._check(raw, where)

    def _check(self, raw: Any, where: str) -> list[Any]:
        if self.one_as_list and isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list):
            hint = _EMPTY if raw is None else "start each entry with '- '" if isinstance(raw, dict) else ""
            raise ConfigError(where, "must be a list", hint)
        if len(raw) < self.min_items:
            raise ConfigError(where, "must be a non-empty list")
        if len(raw) > self.max_items:  # and its entries are not looked at
            raise ConfigError(where, f"must have at most {self.max_items} entries (got {len(raw)})")
        problems = Problems()
        values: list[Any] = []
        seen: dict[Any, int] = {}
        for i, x in enumerate(raw):
            with problems.gathered():
                value = self.item.check(x, f"{where}[{i}]")
                values.append(value)
                if self.unique:
                    if value in seen:
                        raise ConfigError(f"{where}[{i}]", f"repeats {where}[{seen[value]}]")
                    seen[value] = i
        problems.raise_any()
        return values

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array"}
        if self.description:
            out["description"] = self.description
        if self.min_items:
            out["minItems"] = self.min_items
        out["maxItems"] = self.max_items
        if self.unique:
            out["uniqueItems"] = True
        out["items"] = self.item.schema()
        if self.one_as_list:
            description = out.pop("description", None)
            out = {"anyOf": [self.item.schema(), out]}
            if description:
                out["description"] = description
        return out


@dataclass(frozen=True)
class Table:
    """A mapping of names (``key``) to values (``value``: any rule)."""

    key: Text
    value: Rule
    max_items: int
    description: str = ""

    def check(self, raw: Any, where: str) -> dict[str, Any]:
        with _hint_budget():
            return self._check(raw, where)

    def _check(self, raw: Any, where: str) -> dict[str, Any]:
        if not isinstance(raw, dict):
            hint = _EMPTY if raw is None else "write NAME: value entries, not a list" if isinstance(raw, list) else ""
            raise ConfigError(where, "must be a mapping of names to values", hint)
        if len(raw) > self.max_items:
            raise ConfigError(where, f"must have at most {self.max_items} entries (got {len(raw)})")
        problems = Problems()
        out: dict[str, Any] = {}
        for k, v in raw.items():
            name = _key(where, k)
            with problems.gathered():
                if not isinstance(k, str):
                    raise ConfigError(name, "must be a string key")
                self.key.check(k, name)
            with problems.gathered():
                out[k] = self.value.check(v, name)
        problems.raise_any()
        return out

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object"}
        if self.description:
            out["description"] = self.description
        out["maxProperties"] = self.max_items
        out["propertyNames"] = {k: v for k, v in self.key.schema().items() if k not in ("type", "description")}
        out["additionalProperties"] = self.value.schema()
        return out


@dataclass(frozen=True)
class Unsupported:
    """A list field another program's format has and this one refuses, saying why (an empty
    list says nothing and passes); the schema refuses the same (``maxItems: 0``)."""

    problem: str

    def check(self, raw: Any, where: str) -> list[Any]:
        if raw != []:
            raise ConfigError(where, self.problem)
        return []

    def schema(self) -> dict[str, Any]:
        return {"type": "array", "maxItems": 0, "description": f"Refused: {self.problem}."}


@dataclass(frozen=True)
class Field:
    rule: Rule
    required: bool = False


@dataclass(frozen=True)
class Record:
    fields: dict[str, Field]
    description: str = ""

    def check(self, raw: Any, where: str) -> dict[str, Any]:
        with _hint_budget():
            return self._check(raw, where)

    def _check(self, raw: Any, where: str) -> dict[str, Any]:
        if not isinstance(raw, dict):
            required = [k for k, f in self.fields.items() if f.required]
            hint = _EMPTY if raw is None else ""
            if isinstance(raw, str) and required:
                hint = f"write its fields as key: value ({', '.join(f'{k}: ...' for k in required)})"
            raise ConfigError(where, "must be a mapping", hint)
        problems = Problems()
        out: dict[str, Any] = {}
        for key, value in raw.items():
            field = self.fields.get(key)
            with problems.gathered():
                if field is None:
                    if hint := self._elsewhere(key):
                        raise ConfigError(_key(where, key), "unknown key", hint)
                    raise ConfigError(_key(where, key), f"unknown key (known: {', '.join(sorted(self.fields))})")
                out[key] = field.rule.check(value, _key(where, key))
        for key in sorted(k for k, f in self.fields.items() if f.required):
            if key not in raw:
                problems.add(ConfigError(_key(where, key), "is required"))
        problems.raise_any()
        return out

    def _elsewhere(self, key: Any) -> str:
        """Where an unknown key was probably meant: a known one it resembles, or the
        record one level down that has it."""
        if not isinstance(key, str):
            return ""
        if near := _near(key, tuple(self.fields)):
            return near
        for name, f in self.fields.items():
            rule, each = (f.rule.item, True) if isinstance(f.rule, Items) else (f.rule, False)
            rule = rule.rule if isinstance(rule, Then) else rule
            if isinstance(rule, Record) and key in rule.fields:
                return f"{key} goes in each entry of {name}" if each else f"{key} goes under {name}"
        return ""

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object", "additionalProperties": False}
        required = [k for k, f in self.fields.items() if f.required]
        if required:
            out["required"] = required
        if self.description:
            out["description"] = self.description
        out["properties"] = {k: f.rule.schema() for k, f in self.fields.items()}
        return out


@dataclass(frozen=True)
class Then:
    """A rule, then ``then``: what no schema can say about the value it checked (raises
    ConfigError). The schema is the rule's alone."""

    rule: Rule
    then: Callable[[Any, str], Any]

    def check(self, raw: Any, where: str) -> Any:
        return self.then(self.rule.check(raw, where), where)

    def schema(self) -> dict[str, Any]:
        return self.rule.schema()


Rule = Text | Integer | Flag | Items | Table | Unsupported | Record | Then


def _near(word: str, known: tuple[str, ...]) -> str:
    """'did you mean ...?' for a word close to one of ``known`` (letter case aside), while
    the budget of the check lasts."""
    left = _hints_left.get()
    if left is not None:
        if left[0] <= 0:
            return ""
        left[0] -= 1
    close = difflib.get_close_matches(word.lower(), known, n=1, cutoff=0.6) if len(word) <= 80 else []
    return f"did you mean {close[0]!r}?" if close else ""


def _number_hint(raw: Any) -> str:
    if raw is None:
        return _EMPTY
    if isinstance(raw, str) and raw.strip().isdigit():
        return f"write it without quotes: {raw.strip()}"
    return ""


def _key(where: str, key: Any) -> str:
    """The field name of a mapping key; one that is not plain text is quoted."""
    plain = isinstance(key, str) and key.isprintable() and key.strip() == key and len(key) <= 80
    text = key if plain else shown(key)
    return f"{where}.{text}" if where != "config" else text
