"""The only place structlog is configured.

Console output when stderr is a terminal, JSON lines otherwise; always to stderr,
so stdout stays free for machine output.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

_configured = False


class _Stderr:
    """Whatever sys.stderr is at the moment of writing (tests swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


# The JSON lines are rendered by these processors, structlog's or not (see info()).


def _add_level(_logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    # As structlog's add_log_level: `warn` and `exception` are aliases.
    event_dict["level"] = {"warn": "warning", "exception": "error"}.get(method_name, method_name)
    return event_dict


def _add_utc_timestamp(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    event_dict["timestamp"] = datetime.now(tz=UTC).isoformat().replace("+00:00", "Z")
    return event_dict


# One encoder for every event: json.dumps with options builds a new one per call,
# which adds up at one event per run.
_ENCODER = json.JSONEncoder(default=repr, ensure_ascii=False)


def _render_json(_logger: Any, _method: str, event_dict: dict[str, Any]) -> str:
    return _ENCODER.encode(event_dict)


def configure(level: str = "info", *, json: bool | None = None) -> None:
    global _configured
    import structlog

    if json is None:
        json = not sys.stderr.isatty()
    processors: list[Any]
    if json:
        processors = [
            _add_level,
            _add_utc_timestamp,
            structlog.processors.format_exc_info,
            _render_json,
        ]
    else:
        processors = [
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=True),
        ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
            if hasattr(logging, "getLevelNamesMapping")
            else logging.INFO
        ),
        logger_factory=structlog.WriteLoggerFactory(_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    _configured = True


def get_logger(**bound: Any) -> Any:
    import structlog

    if not _configured:
        configure()
    return structlog.get_logger("jobrunner").bind(**bound)


def info(event: str, **fields: Any) -> None:
    """Log one event of a command (not of a run), as get_logger().info(event, **fields) does.

    Until structlog is configured, a JSON line is rendered here by the processors
    configure() would install (at its default level, info): a tick with nothing to do
    logs its summary without importing structlog, the largest part of its start-up
    after the database driver.
    """
    if _configured or sys.stderr.isatty():
        get_logger().info(event, **fields)
        return
    event_dict = _add_level(None, "info", {**fields, "event": event})
    event_dict = _add_utc_timestamp(None, "info", event_dict)
    sys.stderr.write(_render_json(None, "info", event_dict) + "\n")
    sys.stderr.flush()
