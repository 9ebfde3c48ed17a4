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

from cronjob.text import printable, redact

_configured = False
# One encoder for every event: json.dumps with options builds a new one per call,
# which adds up at one event per run.
_JSON_ENCODER = json.JSONEncoder(default=repr, ensure_ascii=False)


def _flat_record_encoder() -> Any:
    """_JSON_ENCODER.encode for the flat dicts of plain values a tick logs per run.

    JSONEncoder.encode builds a new C encoder on every call, which is most of its
    cost for a small dict. The one kept here skips the circular-reference check:
    nothing in a flat dict of strings and numbers can refer back to it.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator on this interpreter
        return _JSON_ENCODER.encode
    enc = _JSON_ENCODER
    encoder = make(
        None,
        enc.default,
        json.encoder.encode_basestring,
        enc.indent,
        enc.key_separator,
        enc.item_separator,
        enc.sort_keys,
        enc.skipkeys,
        enc.allow_nan,
    )
    return lambda record: "".join(encoder(record, 0))


_encode_flat_record = _flat_record_encoder()
# Set when events are JSON lines: the per-run events of a batch are then rendered
# here in one pass and written at once (see `log_many`).
_json_lines = False
# The least severe level written (--log-level / JOBRUNNER_LOG_LEVEL), as logging numbers it.
_min_level = logging.INFO


class _Stderr:
    """Whatever sys.stderr is at the moment of writing (tests swap it), and the one way
    log lines leave the program: the database password is removed here, once."""

    def write(self, text: str) -> int:
        return sys.stderr.write(redact(text))

    def flush(self) -> None:
        sys.stderr.flush()


# JSON lines are rendered by these processors, through structlog or not (see `info`).

# As structlog's add_log_level: `warn` and `exception` are aliases.
_LEVEL_ALIASES = {"warn": "warning", "exception": "error"}


def _add_level(_logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    event_dict["level"] = _LEVEL_ALIASES.get(method_name, method_name)
    return event_dict


def _add_utc_timestamp(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    event_dict["timestamp"] = _utc_timestamp()
    return event_dict


def _utc_timestamp() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _render_json(_logger: Any, _method: str, event_dict: dict[str, Any]) -> str:
    return _JSON_ENCODER.encode(event_dict)


def _render_json_line(_logger: Any, _method: str, event_dict: dict[str, Any]) -> str:
    """`_render_json` for structlog: the line goes into the current run log too, if any."""
    line = _JSON_ENCODER.encode(event_dict)
    _capture_json_line(line)
    return line


def _no_run_log(_line: str) -> None:
    return None


_capture_json_line = _no_run_log  # cronjob.runlog's, once configure() ran


def _printable_values(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """On a terminal, a job type or error message written by anyone must not drive it:
    control characters in values are shown escaped (a traceback keeps its lines)."""
    return {
        key: printable(value, keep_newlines=key == "exception") if isinstance(value, str) else value
        for key, value in event_dict.items()
    }


LEVELS = ("debug", "info", "warning", "error")


def set_level(level: str) -> None:
    """Write only lines at `level` or more severe, from now on; structlog is not imported."""
    global _min_level
    _min_level = _level_number(level)
    if _configured:
        configure()


def configure(level: str | None = None, *, json: bool | None = None) -> None:
    """Set structlog up, at `level` if given (from then on), else at the level set before."""
    global _configured, _json_lines, _min_level
    import structlog

    from cronjob import runlog

    global _capture_json_line
    _capture_json_line = runlog.capture_json_line
    if level is not None:
        _min_level = _level_number(level)
    if json is None:
        json = not sys.stderr.isatty()
    processors: list[Any]
    _json_lines = json
    if json:
        processors = [
            _add_level,
            _add_utc_timestamp,
            structlog.processors.format_exc_info,
            _render_json_line,  # a handler's events go into its run log too
        ]
    else:
        processors = [
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            structlog.processors.format_exc_info,
            runlog.capture_structlog_event,
            _printable_values,
            structlog.dev.ConsoleRenderer(colors=True),
        ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_min_level),
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
    """Log one event of a command (not of a run), as get_logger().info(event, **fields) does."""
    log_event("info", event, **fields)


def log_event(level: str, event: str, **fields: Any) -> None:
    """Log one event at `level`, as getattr(get_logger(), level)(event, **fields) does.

    Until structlog is configured, a JSON line is rendered here by the processors
    configure() would install, at the level set now: a tick with nothing to do
    logs its summary without importing structlog, the largest part of its start-up
    after the database driver.
    """
    if _configured or sys.stderr.isatty():
        getattr(get_logger(), level)(event, **fields)
        return
    if _level_number(level) < _min_level:
        return
    event_dict = _add_level(None, level, {**fields, "event": event})
    event_dict = _add_utc_timestamp(None, level, event_dict)
    _Stderr().write(_render_json(None, level, event_dict) + "\n")
    sys.stderr.flush()


class _LibraryRecords(logging.Handler):
    """A library's log records, written as jobrunner's own events."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a library's bad format string must not lose the record
            message = str(record.msg)
        level = record.levelname.lower()
        fields = {"logger": record.name}
        if record.exc_info and record.exc_info[1] is not None:
            # What the library logged with the record (Django's failed task: its error).
            import traceback

            fields["exception"] = "".join(traceback.format_exception(record.exc_info[1]))
        log_event(level if level in _LIBRARY_LEVELS else "warning", message, **fields)


_LIBRARY_LEVELS = frozenset({"debug", "info", "warning", "error", "critical"})
# The libraries whose own logging reaches jobrunner's stderr: the database driver
# reports, for one, errors it ignored while cleaning up after a lost connection.
LIBRARY_LOGGERS = ("psycopg",)


def capture_library_logs(names: tuple[str, ...] = LIBRARY_LOGGERS, *, level: int = 0) -> None:
    """Send the libraries' standard-library log records through jobrunner's own stream.

    Left alone, Python writes them as plain text between jobrunner's JSON lines. `level`,
    when given, is the least severe record the loggers pass on (the dashboard's server logs
    each request at info, below the standard library's default).
    """
    for name in names:
        logger = logging.getLogger(name)
        if level:
            logger.setLevel(level)
        if not any(isinstance(h, _LibraryRecords) for h in logger.handlers):
            logger.addHandler(_LibraryRecords())
            logger.propagate = False


def writes(level: str) -> bool:
    """Whether a line at `level` is written at the level set now (`set_level`, `configure`)."""
    return _level_number(level) >= _min_level


def _level_number(level: str) -> int:
    return logging.getLevelNamesMapping().get(level.upper(), logging.INFO)


def log_many(logger: Any, level: str, event: str, records: list[dict[str, Any]]) -> None:
    """Log `event` once per record, as `logger.<level>(event, **record)` would.

    Records are the tick's own: dicts of plain values, none of which refers back
    to the record (see `_flat_record_encoder`).

    A tick logs one line per finished run; through the processor chain each line
    costs more than running a no-op handler. In JSON mode the batch gets one
    timestamp (the lines are written at the same moment anyway), the same keys in
    the same order, and one write.
    """
    if not records:
        return
    if not _json_lines:
        method = getattr(logger, level)
        for record in records:
            method(event, **record)
        return
    if _level_number(level) < _min_level:
        return
    import structlog

    context = structlog.get_context(logger)
    tail = {"event": event, "level": level, "timestamp": _utc_timestamp()}
    encode = _JSON_ENCODER.encode
    # The context and the tail are the same on every line: encoded once. A record
    # that repeats one of their keys goes through the whole-dict path, as the
    # logger would overwrite the value in place.
    head = encode(context)[:-1] + ", " if context else "{"
    end = ", " + encode(tail)[1:]
    reserved = context.keys() | tail.keys()
    encode_record = _encode_flat_record
    lines = [
        encode({**context, **record, **tail})
        if not record or reserved & record.keys()
        else head + encode_record(record)[1:-1] + end
        for record in records
    ]
    lines.append("")
    _Stderr().write("\n".join(lines))
    sys.stderr.flush()
