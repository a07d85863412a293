"""Structured logs: JSON lines when not on a terminal, readable text when on one."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


# What of an error string from a peer (the kubelet, the API server) goes into a log line or a probe.
MAX_REASON = 512


def clip(text: str, limit: int = MAX_REASON) -> str:
    """``text`` cut to ``limit`` characters, saying how much more there was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def reason(exc: BaseException) -> str:
    """What went wrong, never empty (some exceptions have no message): clipped."""
    return clip(str(exc) or type(exc).__name__)


class SaidOnce:
    """A failure logged once while it lasts: the same one again is not new, another one is,
    and once it is over the next is new again. Per ``key`` (e.g. a resource), remembering the
    last ``remember`` failures of each (a peer that alternates between two is not news)."""

    def __init__(self, remember: int = 1) -> None:
        self.remember = remember
        self._said: dict[str, dict[str, None]] = {}  # key -> failures said, oldest first

    def new(self, failure: str, key: str = "") -> bool:
        """Whether ``failure`` is news (to be logged); remembers it."""
        said = self._said.setdefault(key, {})
        if failure in said:
            return False
        said[failure] = None
        while len(said) > self.remember:
            del said[next(iter(said))]
        return True

    def over(self, key: str = "") -> bool:
        """The failure ended; whether one had been said (to log that it is over)."""
        return self._said.pop(key, None) is not None


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_extras(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {record.levelname:<7} {record.getMessage()}"
        )
        extras = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        if extras:
            line += f"  [{extras}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(fmt: str, level: str) -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # gRPC, watchdog and HTTP client chatter at info (a line per request) is not ours to report.
    for noisy in ("watchdog", "grpc", "httpx2", "httpcore2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
