"""The rule language of the config file: each rule checks a value and says the same in JSON Schema.

A rule's ``check`` turns a raw YAML value into a checked one or raises ConfigError naming
the field; its ``schema`` is the same rule for the chart's values.schema.json, so the two
cannot drift (tools/gen-config-schema.py writes it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ate_devplugin.config.errors import ConfigError, shown


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
            raise ConfigError(where, f"must be {kind} (got {shown(raw)})")
        if len(raw) > self.max_chars:
            raise ConfigError(where, f"must be at most {self.max_chars} characters (got {len(raw)})")
        for p in self.patterns:
            if not p.holds(raw):
                raise ConfigError(where, f"{p.problem} (got {shown(raw)})")
        return raw

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
            raise ConfigError(where, f"must be {self._kind()} (got {shown(raw)})")
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
            raise ConfigError(where, f"must be true or false (got {shown(raw)})")
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
        if self.one_as_list and isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list):
            raise ConfigError(where, "must be a list")
        if len(raw) < self.min_items:
            raise ConfigError(where, "must be a non-empty list")
        if len(raw) > self.max_items:
            raise ConfigError(where, f"must have at most {self.max_items} entries (got {len(raw)})")
        values = [self.item.check(x, f"{where}[{i}]") for i, x in enumerate(raw)]
        if self.unique:
            seen: dict[Any, int] = {}
            for i, v in enumerate(values):
                if v in seen:
                    raise ConfigError(f"{where}[{i}]", f"repeats {where}[{seen[v]}]")
                seen[v] = i
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
    """A mapping of names (``key``) to values."""

    key: Text
    value: Text
    max_items: int
    description: str = ""

    def check(self, raw: Any, where: str) -> dict[str, str]:
        if not isinstance(raw, dict):
            raise ConfigError(where, "must be a mapping of names to values")
        if len(raw) > self.max_items:
            raise ConfigError(where, f"must have at most {self.max_items} entries (got {len(raw)})")
        out: dict[str, str] = {}
        for k, v in raw.items():
            name = _key(where, k)
            if not isinstance(k, str):
                raise ConfigError(name, "must be a string key")
            out[self.key.check(k, name)] = self.value.check(v, name)
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
class Field:
    rule: Rule
    required: bool = False


@dataclass(frozen=True)
class Record:
    fields: dict[str, Field]
    description: str = ""

    def check(self, raw: Any, where: str) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise ConfigError(where, "must be a mapping")
        for key in raw:
            if key not in self.fields:
                raise ConfigError(_key(where, key), f"unknown key (known: {', '.join(sorted(self.fields))})")
        for key in sorted(k for k, f in self.fields.items() if f.required):
            if key not in raw:
                raise ConfigError(_key(where, key), "is required")
        return {k: self.fields[k].rule.check(v, _key(where, k)) for k, v in raw.items()}

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object", "additionalProperties": False}
        required = [k for k, f in self.fields.items() if f.required]
        if required:
            out["required"] = required
        if self.description:
            out["description"] = self.description
        out["properties"] = {k: f.rule.schema() for k, f in self.fields.items()}
        return out


Rule = Text | Integer | Flag | Items | Table | Record


def _key(where: str, key: Any) -> str:
    """The field name of a mapping key; one that is not plain text is quoted."""
    plain = isinstance(key, str) and key.isprintable() and key.strip() == key and len(key) <= 80
    text = key if plain else shown(key)
    return f"{where}.{text}" if where != "config" else text
