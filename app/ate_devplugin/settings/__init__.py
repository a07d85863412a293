"""Daemon settings: command-line flags over environment variables over defaults.

* ``options``: the table, one record per option (its check, default, help, when it
  applies, how the chart sets it); everything about options is derived from it.
* ``checks``: one check per kind of value.
* ``resolve``: flags, variables and defaults to :class:`Settings`, every bad value reported.
* ``idle``: what was set but does nothing in the mode (warnings).
* ``parts``: :class:`Settings`, :class:`Timing` (not options, injectable in tests), the
  frozen part each subsystem is handed (``settings.part(DraSettings)``) and ``PARTS``, how
  each is filled.
"""

from ate_devplugin.settings.idle import idle_fields
from ate_devplugin.settings.options import DRA_DRIVER, ENV_PREFIX, GROUPS, OPTIONS, Group, Option
from ate_devplugin.settings.parts import (
    PARTS,
    DaemonSettings,
    DevicePluginSettings,
    DraSettings,
    KvmHealthSettings,
    PodResourcesSettings,
    RuntimeSettings,
    Settings,
    Timing,
)
from ate_devplugin.settings.resolve import resolve, value_of

__all__ = [
    "DRA_DRIVER",
    "ENV_PREFIX",
    "GROUPS",
    "OPTIONS",
    "PARTS",
    "DaemonSettings",
    "DevicePluginSettings",
    "DraSettings",
    "Group",
    "KvmHealthSettings",
    "Option",
    "PodResourcesSettings",
    "RuntimeSettings",
    "Settings",
    "Timing",
    "idle_fields",
    "resolve",
    "value_of",
]
