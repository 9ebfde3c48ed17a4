"""The only place structlog is configured.

Console output when stderr is a terminal, JSON lines otherwise; always to stderr,
so stdout stays free for machine output.

Two levels: what stderr shows (`set_level`, --log-level) and what a run log keeps of a
handler's events (`set_capture_level`, the tick's --capture-level; cronjob.runlog).
An event goes through the processors if either wants it; the last one writes it only at
the first level. Standard `logging` records take the same way (`route_standard_logging`),
and every line logged while a handler runs carries its run's fields.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import threading
import warnings
from datetime import UTC, datetime
from typing import Any

from cronjob.text import json_ready, printable

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
# The least severe level of a handler's events kept in its run log (the tick's
# --capture-level / JOBRUNNER_CAPTURE_LEVEL; cronjob.runlog).
_keep_level = logging.INFO


# sys.stderr writes straight through to its file descriptor, and a pipe takes a write larger
# than PIPE_BUF in pieces: two threads writing long lines at once would interleave them.
_STDERR_LOCK = threading.Lock()


class _Stderr:
    """Whatever sys.stderr is at the moment of writing (tests swap it), and the one way
    log lines leave the program, one whole write at a time. What it writes was made of
    values already redacted (`_ready_values`): a pattern applied to the encoded line could
    eat the quote that ends a JSON string."""

    def write(self, text: str) -> int:
        with _STDERR_LOCK:
            return sys.stderr.write(text)

    def flush(self) -> None:
        with _STDERR_LOCK:
            sys.stderr.flush()


# JSON lines are rendered by these processors, through structlog or not (see `info`).

# As structlog's add_log_level: `warn` and `exception` are aliases.
_LEVEL_ALIASES = {"warn": "warning", "exception": "error"}


def _add_level(_logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    event_dict["level"] = _LEVEL_ALIASES.get(method_name, method_name)
    return event_dict


def _drop_unwanted(_logger: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Only an event stderr shows or a run log keeps goes on: the loggers filter at the
    less severe of the two levels (`_filter_level`)."""
    levelno = _method_level(method)
    if levelno >= _min_level:
        return event_dict
    if levelno >= _keep_level:
        from cronjob import runlog

        if runlog.keeping():
            return event_dict
    raise _drop_event()


def _drop_event() -> Exception:
    import structlog

    return structlog.DropEvent()


def _stderr_only(_logger: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """After the run log took what it keeps: an event below stderr's level goes no further."""
    if _method_level(method) < _min_level:
        raise _drop_event()
    return event_dict


def _bind_run(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """An event logged while a handler runs carries its run's fields, as ctx.log's do,
    whichever logger logged it."""
    if "run_id" in event_dict:
        return event_dict
    from cronjob import runlog

    fields = runlog.run_fields()
    return event_dict if fields is None else {**fields, **event_dict}


def _add_utc_timestamp(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    event_dict["timestamp"] = _utc_timestamp()
    return event_dict


def _utc_timestamp() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _ready_values(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Every value of the event redacted and made JSON's and PostgreSQL's (text.json_ready),
    before anything encodes it: whatever a handler logs, the line is one valid JSON object,
    and the run log that keeps it can be stored."""
    return json_ready(event_dict)  # type: ignore[no-any-return]


def _render_json(_logger: Any, _method: str, event_dict: dict[str, Any]) -> str:
    return _JSON_ENCODER.encode(event_dict)


def _render_json_line(_logger: Any, method: str, event_dict: dict[str, Any]) -> str:
    """`_render_json` for structlog: the line goes into the current run log too, if it keeps
    the event's level, and to stderr if stderr shows it."""
    from cronjob import runlog

    line = _JSON_ENCODER.encode(event_dict)
    levelno = _method_level(method)
    if levelno >= _keep_level and not _record_written.get():
        runlog.capture_json_line(line)
    if levelno < _min_level:
        raise _drop_event()
    return line


def _capture_console_event(logger: Any, method: str, event_dict: dict[str, Any]) -> Any:
    """runlog.capture_structlog_event, for an event that is not a record's (see below)."""
    if _record_written.get() or _method_level(method) < _keep_level:
        return event_dict
    from cronjob import runlog

    return runlog.capture_structlog_event(logger, method, event_dict)


# Set while a standard `logging` record is written as an event (`_Records`): the run log
# has it already, from the record factory (runlog.capture_logging_records), and must not
# keep it twice.
_record_written: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "jobrunner_record_written", default=False
)


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


def set_capture_level(level: str) -> None:
    """Keep in run logs a handler's events at `level` or more severe, from now on, whatever
    stderr shows (cronjob.runlog)."""
    global _keep_level
    _keep_level = _level_number(level)
    if _configured:
        configure()


def capture_level() -> int:
    """The least severe level of a handler's events kept, as `logging` numbers it."""
    return _keep_level


def _filter_level() -> int:
    """The least severe event anyone wants: stderr, or a run log."""
    return min(_min_level, _keep_level)


def configure(level: str | None = None, *, json: bool | None = None) -> None:
    """Set structlog up, at `level` if given (from then on), else at the level set before."""
    global _configured, _json_lines, _min_level
    import structlog

    if level is not None:
        _min_level = _level_number(level)
    if json is None:
        json = not sys.stderr.isatty()
    processors: list[Any]
    _json_lines = json
    if json:
        processors = [
            _drop_unwanted,
            _add_level,
            _add_utc_timestamp,
            structlog.processors.format_exc_info,
            _bind_run,
            _ready_values,
            _render_json_line,  # a handler's events go into its run log too
        ]
    else:
        processors = [
            _drop_unwanted,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            structlog.processors.format_exc_info,
            _bind_run,
            _ready_values,
            _capture_console_event,
            _stderr_only,
            _printable_values,
            structlog.dev.ConsoleRenderer(colors=True),
        ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_filter_level()),
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
    event_dict = _ready_values(None, level, event_dict)
    _Stderr().write(_render_json(None, level, event_dict) + "\n")
    sys.stderr.flush()


class _Records(logging.Handler):
    """Standard `logging` records, written as jobrunner's own events: on stderr at its
    level, with the fields of the run whose handler logged them (a run log has them
    already, from runlog.capture_logging_records)."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < _min_level:
            return
        from cronjob import runlog

        fields = {**(runlog.run_fields() or {}), **runlog.record_fields(record)}
        token = _record_written.set(True)
        try:
            log_event(runlog.record_level(record), runlog.record_message(record), **fields)
        finally:
            _record_written.reset(token)


class _RootRecords(_Records):
    """The root logger's handler, where the app set none (see `route_standard_logging`)."""


def route_standard_logging() -> None:
    """Records of the standard `logging`, any logger's, written as jobrunner's events at
    --log-level, and created down to the less severe of --log-level and --capture-level
    so that a run log can keep them: what Python's `logging.basicConfig` would do, in
    jobrunner's format.

    Only where the app configured no handler of its own on the root logger (its handler
    modules and Django's LOGGING have been loaded by then): an app's own logging setup
    is left as it is, and its records are still kept in run logs at the levels it lets
    them be created. Without a handler there, the first `logging.warning()` a handler
    calls would install Python's plain-text one.
    """
    root = logging.getLogger()
    if any(not isinstance(handler, _Records) for handler in root.handlers):
        return
    if not root.handlers:
        root.addHandler(_RootRecords())
    root.setLevel(_filter_level())


class _LibraryRecords(_Records):
    """A library's log records (see `capture_library_logs`)."""


def write_unhandled_records() -> None:
    """Standard `logging` records no handler takes (an app that configured no logging) are
    written as jobrunner's events, at warning and above, as Python's last resort writes
    them: its plain text would be a line that is not JSON, with nothing redacted. Python's
    warnings (`warnings.warn`) become such records (logger `py.warnings`, as
    `logging.captureWarnings` names them), for the same reason."""
    if not isinstance(logging.lastResort, _Records):
        logging.lastResort = _Records(logging.WARNING)
    if warnings.showwarning is not _show_warning:
        warnings.showwarning = _show_warning


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    # As logging.captureWarnings shows one, without the handler it adds that drops the
    # record where the app set none: the last resort above writes it then.
    text = warnings.formatwarning(message, category, filename, lineno, line)
    if file is not None:  # asked for somewhere of its own, as Python writes it there
        with contextlib.suppress(OSError):
            file.write(text)
        return
    logging.getLogger("py.warnings").warning("%s", text.rstrip("\n"))


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


# Levels as `logging` numbers them, by structlog's method names (add_log_level's aliases too).
_METHOD_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}


def _method_level(method: str) -> int:
    return _METHOD_LEVELS.get(method, logging.INFO)


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

    # Redacted and made JSON's value by value, as the processors do for a single event.
    context = json_ready(structlog.get_context(logger))
    tail = json_ready({"event": event, "level": level, "timestamp": _utc_timestamp()})
    records = [json_ready(record) for record in records]
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
