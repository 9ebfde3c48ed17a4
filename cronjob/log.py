"""The only place structlog is configured.

Console output when stderr is a terminal, JSON lines otherwise; always to stderr,
so stdout stays free for machine output.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

_configured = False


class _Stderr:
    """Whatever sys.stderr is at the moment of writing (tests swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(level: str = "info", *, json: bool | None = None) -> None:
    global _configured
    import structlog

    if json is None:
        json = not sys.stderr.isatty()
    renderer: Any
    if json:
        import json as json_module

        # One encoder for every event: json.dumps with options builds a new one
        # per call, which adds up at one event per run.
        encoder = json_module.JSONEncoder(default=repr, ensure_ascii=False)
        renderer = structlog.processors.JSONRenderer(
            serializer=lambda event, **_: encoder.encode(event)
        )
        timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=True)
        timestamper = structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            timestamper,
            structlog.processors.format_exc_info,
            renderer,
        ],
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
