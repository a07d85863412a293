"""Resolving the options: a flag wins over its ATE_DEVPLUGIN_* variable, which wins over the default."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ate_devplugin.config import ConfigError, Problems
from ate_devplugin.settings.idle import idle_options
from ate_devplugin.settings.options import GROUPS, OPTIONS, Option
from ate_devplugin.settings.parts import Settings


def resolve(flags: Mapping[str, str | None], env: Mapping[str, str]) -> Settings:
    """Every option of the table from ``flags`` (by key, None when not given), ``env`` or its default.

    Raises ConfigError with every bad value, each named as the user set it (``--mode``,
    ``ATE_DEVPLUGIN_MODE``), in the order of the table; ``Settings.idle`` holds those given
    that do nothing here."""
    given: dict[str, str] = {}  # key -> the flag or variable that set it
    values: dict[str, Any] = {}
    problems = Problems()
    for option in (o for g in GROUPS for o in g.options):
        text, name = _text(option, flags, env)
        if name is not None:
            given[option.key] = name
        try:
            value = option.check(text, name or option.flag)
            if option.derive is not None and not value:
                value = option.derive(values)
        except ConfigError as exc:
            problems.add(exc)
            continue
        except KeyError:  # derived from an option found wrong: that one is reported
            continue
        values[option.key] = value
        if option.required and not value and values.get("mode") in option.applies.modes:
            problems.add(ConfigError(name or option.flag, f"is required in mode {values['mode']}: {_sources(option)}"))
    problems.raise_any()
    return Settings(values, idle=tuple(idle_options(values, given)))


def _text(option: Option[Any], flags: Mapping[str, str | None], env: Mapping[str, str]) -> tuple[str, str | None]:
    """The option's text and the flag or variable it came from (None: not given, the default)."""
    flag = flags.get(option.key)
    if flag is not None:
        text, name = flag, option.flag
    elif option.variable in env:
        text, name = env[option.variable], option.variable
    else:
        text, name = option.default, None
    if not text and option.fallback_env:
        text = env.get(option.fallback_env, "")  # the chart's, from the downward API
    return text, name


def _sources(option: Option[Any]) -> str:
    fallback = f"{option.fallback_env} (downward API), " if option.fallback_env else ""
    return f"set {fallback}{option.variable} or {option.flag}"


def value_of(key: str, flag: str | None, env: Mapping[str, str]) -> Any:
    """One option alone (check-config judges a file for the mode); raises ConfigError."""
    option = OPTIONS[key]
    text, name = _text(option, {key: flag}, env)
    return option.check(text, name or option.flag)
