"""API object names, checked as the API server defines them before they reach a URL path.

Object names (claims, slices, nodes) are DNS-1123 subdomains: at most 253 characters of
lower-case letters, digits, ``-`` and ``.``, each dot-separated part starting and ending
with a letter or digit. Namespaces are DNS-1123 labels: at most 63 characters, no dots.
Neither can hold ``/``, so a checked name never leaves the path it is put in.
"""

from __future__ import annotations

import re

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_NAMESPACE = re.compile(_LABEL)
MAX_SUBDOMAIN = 253
MAX_LABEL = 63
_SHOWN = 80  # of a bad name, in an error


class InvalidNameError(ValueError):
    pass


def check_name(name: str, what: str = "name") -> str:
    """``name`` when it is a DNS-1123 subdomain; raises InvalidNameError saying why not."""
    if len(name) > MAX_SUBDOMAIN or not _SUBDOMAIN.fullmatch(name):
        raise InvalidNameError(f"{what} {_show(name)} is not a valid object name (DNS-1123 subdomain)")
    return name


def check_namespace(namespace: str) -> str:
    """``namespace`` when it is a DNS-1123 label; raises InvalidNameError saying why not."""
    if len(namespace) > MAX_LABEL or not _NAMESPACE.fullmatch(namespace):
        raise InvalidNameError(f"namespace {_show(namespace)} is not a valid namespace (DNS-1123 label)")
    return namespace


def _show(name: str) -> str:
    return repr(name if len(name) <= _SHOWN else name[:_SHOWN] + "...")
