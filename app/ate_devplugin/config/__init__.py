"""The resource configuration file: one typed, versioned model, its only definition.

* ``rules``: the rule language; each rule checks a value and says the same in JSON Schema,
  so the chart's ``values.schema.json`` for ``deviceConfig`` is generated from here
  (tools/gen-config-schema.py) and cannot drift.
* ``schema``: the file's format, stated in those rules.
* ``model``: the typed model the daemon runs on, and the limits it keeps.
* ``checks``: the rules a schema cannot say, within a resource and across resources
  (generated into the chart's ``_deviceconfig.tpl``).
* ``files``: reading and parsing, bounded, never blocking on I/O.

Every problem found is a line of one ConfigError naming the field (e.g.
``resources[1].units``), what is wrong with it and, for the common mistakes, a hint, so
the CLI can print one line per problem and exit 2. What the rest of the
daemon uses is importable from here.
"""

from ate_devplugin.config.checks import (
    PROFILE_COLLISION,
    cdi_name_problem,
    check_across,
    profile_entry,
    profile_warnings,
    resource_from,
    resources_from_document,
    restore_profile,
    restore_profile_warnings,
    template_effect,
)
from ate_devplugin.config.errors import EXIT_CONFIG, MAX_PROBLEMS, ConfigError, Problem, Problems, config_error
from ate_devplugin.config.files import (
    MAX_CONFIG_BYTES,
    MAX_YAML_NODES,
    decode,
    decode_resources,
    load,
    load_resources,
    parse_resources,
    read_again,
    read_bounded,
    read_config_file,
)
from ate_devplugin.config.model import (
    ALLOCATE_BOTH,
    ALLOCATE_CDI,
    ALLOCATE_DEVICES,
    ALLOCATE_MODES,
    CONFIG_VERSION,
    DEFAULT_PERMISSIONS,
    DEFAULT_RESOURCES,
    DEFAULT_UNITS,
    MAX_DEVICES,
    MAX_DOMAIN_CHARS,
    MAX_ENV,
    MAX_ENV_NAME_CHARS,
    MAX_ENV_VALUE_CHARS,
    MAX_ID,
    MAX_MESSAGE_BYTES,
    MAX_MOUNTS,
    MAX_NAME_PART_CHARS,
    MAX_PATH_CHARS,
    MAX_PROFILE_NAME_CHARS,
    MAX_RESOURCES,
    MAX_RESTORE_PROFILES,
    MAX_SOCKET_PATH,
    MAX_TOTAL_UNITS,
    RESTORE_PREFIX,
    SOCKET_CHARS,
    MountConfig,
    ResourceConfig,
    is_glob,
    max_units,
    socket_name,
)
from ate_devplugin.config.schema import CPU_TEMPLATE, DOCUMENT, RESOURCE, RESOURCES

__all__ = [
    "ALLOCATE_BOTH",
    "ALLOCATE_CDI",
    "ALLOCATE_DEVICES",
    "ALLOCATE_MODES",
    "CONFIG_VERSION",
    "CPU_TEMPLATE",
    "DEFAULT_PERMISSIONS",
    "DEFAULT_RESOURCES",
    "DEFAULT_UNITS",
    "DOCUMENT",
    "EXIT_CONFIG",
    "MAX_CONFIG_BYTES",
    "MAX_DEVICES",
    "MAX_DOMAIN_CHARS",
    "MAX_ENV",
    "MAX_ENV_NAME_CHARS",
    "MAX_ENV_VALUE_CHARS",
    "MAX_ID",
    "MAX_MESSAGE_BYTES",
    "MAX_MOUNTS",
    "MAX_NAME_PART_CHARS",
    "MAX_PATH_CHARS",
    "MAX_PROBLEMS",
    "MAX_PROFILE_NAME_CHARS",
    "MAX_RESOURCES",
    "MAX_RESTORE_PROFILES",
    "MAX_SOCKET_PATH",
    "MAX_TOTAL_UNITS",
    "MAX_YAML_NODES",
    "PROFILE_COLLISION",
    "RESOURCE",
    "RESOURCES",
    "RESTORE_PREFIX",
    "SOCKET_CHARS",
    "ConfigError",
    "MountConfig",
    "Problem",
    "Problems",
    "ResourceConfig",
    "cdi_name_problem",
    "check_across",
    "config_error",
    "decode",
    "decode_resources",
    "is_glob",
    "load",
    "load_resources",
    "max_units",
    "parse_resources",
    "profile_entry",
    "profile_warnings",
    "read_again",
    "read_bounded",
    "read_config_file",
    "resource_from",
    "resources_from_document",
    "restore_profile",
    "restore_profile_warnings",
    "socket_name",
    "template_effect",
]
