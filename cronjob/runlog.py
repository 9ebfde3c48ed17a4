"""What a handler logged while it ran, kept with its attempt: the run log.

While a handler runs, its thread (or, for an `async def` handler, its task) has its run
as the current one (`capture`): every line logged there, through structlog or the
standard `logging`, carries the run's fields (`run_fields`) on stderr. With capture on
(the default; `@handler(..., capture_logs=False)` switches it off for a type) the run
also has a `RunLog`: every event logged through jobrunner's logging (`ctx.log`, and any
structlog logger), as the JSON line the tick writes for it on stderr, and every standard
`logging` record created there, are added to it, besides going where they always go.
What is kept has a level of its own (the tick's `--capture-level`, info unless told;
cronjob.log checks it), apart from what stderr shows (`--log-level`). The tick writes the lot
with the attempt's outcome, in the same statement (table job_run_logs, migration 0019).

Capped per attempt: the newest `MAX_EVENTS` events and at most `MAX_BYTES` of their JSON
(UTF-8 bytes, as stored) are kept, and `trimmed` counts the older ones dropped; an event
whose JSON alone is over `MAX_EVENT_BYTES` keeps its level, time and the start of its
message. Every event's values are redacted and made storable (`text.json_ready`) before
it is encoded, as every stored text is: a line of stderr was made so by `cronjob.log`
already. What the finalize stores is checked once more (`RunLog.json`): a log PostgreSQL
would refuse is replaced by a note saying so, and can fail no other run's finalize.

A leaf of the logging layer: it imports nothing of the tick.
"""

from __future__ import annotations

import contextvars
import json
import logging
import traceback
from collections import deque
from datetime import UTC, datetime
from typing import Any, Protocol

from cronjob.text import json_ready, jsonb_accepts, printable

MAX_EVENTS = 100
MAX_BYTES = 32_768
MAX_EVENT_BYTES = 4_096
MESSAGE_CLIP = 1_000  # bytes of an oversized event's message kept, at most

# Bound by ctx.log to every event of a run: kept as written, left out where `show` prints.
RUN_FIELDS = frozenset({"run_id", "job_type", "attempt", "tenant_id"})


class Holder(Protocol):
    """A run whose handler is running (the tick's Flight): its run log, if it keeps one,
    is made on the first event, so an attempt that logs nothing allocates nothing."""

    logs: RunLog | None

    @property
    def keeps_logs(self) -> bool: ...

    def run_fields(self) -> dict[str, Any]:
        """run_id, job_type, attempt (and tenant_id), as ctx.log binds them."""
        ...


_current: contextvars.ContextVar[Holder | None] = contextvars.ContextVar(
    "jobrunner_run_log", default=None
)
_ENCODE = json.JSONEncoder(default=repr, ensure_ascii=False).encode
# The least severe standard `logging` record kept (`capture_logging_records`).
_record_level = logging.INFO


class RunLog:
    """The events of one attempt, encoded as JSON objects, newest last."""

    __slots__ = ("closed", "events", "pending", "size", "trimmed")

    def __init__(self) -> None:
        self.events: deque[str] | None = None
        self.size = 0
        self.trimmed = 0
        self.closed = False
        # A standard `logging` record just made: read once its logger has given it the
        # fields of its `extra=` (after the record factory returned), that is when the
        # next event comes or the attempt ends.
        self.pending: tuple[logging.LogRecord, dict[str, Any]] | None = None

    def __bool__(self) -> bool:
        return self.events is not None or self.pending is not None

    def add(self, event: dict[str, Any]) -> None:
        """An event's fields, as logged: made ready (text.json_ready), then encoded."""
        self.add_json(_ENCODE(json_ready(event)))

    def add_record(self, record: logging.LogRecord, run_fields: dict[str, Any]) -> None:
        """A standard `logging` record made while the handler of the run of `run_fields`
        ran (they are read there, not where the record is encoded)."""
        if self.closed:
            return
        self._add_pending()
        self.pending = (record, run_fields)

    def _add_pending(self) -> None:
        # Also called by the finalize (`json`), on another thread than the handler's that
        # may still set `pending` (a handler given up at its timeout): read once, and
        # never raised from, whatever the record holds.
        pending = self.pending
        if pending is None:
            return
        self.pending = None
        record, fields = pending
        try:
            event = {**fields, **_record_event(record)}
        except Exception:
            event = {"timestamp": utc_timestamp(), "level": "warning", "event": _UNREADABLE}
        self.add(event)

    def add_json(self, text: str) -> None:
        """An event already encoded as a JSON object from values made ready
        (text.json_ready): the line the tick wrote for it."""
        if self.closed:
            return
        if self.pending is not None:
            self._add_pending()
        size = _utf8_size(text)
        if size > MAX_EVENT_BYTES:
            text = _clipped(_decoded(text), size)
            size = _utf8_size(text)
        if self.events is None:
            self.events = deque()
        self.events.append(text)
        self.size += size + 1
        while len(self.events) > MAX_EVENTS or self.size > MAX_BYTES:
            self.size -= _utf8_size(self.events.popleft()) + 1
            self.trimmed += 1

    def close(self) -> None:
        """The attempt was given up: what its handler logs from now on is not kept."""
        self._add_pending()
        self.closed = True

    def json(self) -> str:
        """The events as one JSON array, oldest first, as the finalize stores them.

        Checked on its own, before it joins the statement that finalizes a batch: an array
        PostgreSQL's jsonb would refuse (no event should be one) is replaced by a note, so
        that this run loses its log, and no other run its finalize.
        """
        self._add_pending()
        text = "[" + ",".join(list(self.events or ())) + "]"
        if jsonb_accepts(text):
            return text
        note = {
            "timestamp": utc_timestamp(),
            "level": "warning",
            "event": "this attempt's log could not be stored: dropped",
            "dropped_events": len(self.events or ()),
        }
        return _ENCODE([note])


_UNREADABLE = "a standard logging record that could not be read: dropped"


def _decoded(text: str) -> dict[str, Any]:
    try:
        event = json.loads(text)
    except (ValueError, RecursionError):  # not JSON after all: its start kept as a message
        return {"event": text}
    return event if isinstance(event, dict) else {}


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _clipped(event: dict[str, Any], size: int) -> str:
    """An oversized event's time, level and the start of its message, encoded within
    MAX_EVENT_BYTES (its message's escapes may take six bytes a character)."""
    message = str(event.get("event", ""))
    clip = MESSAGE_CLIP
    while True:
        start = message.encode("utf-8", "surrogatepass")[:clip].decode("utf-8", "ignore")
        text = _ENCODE({
            "timestamp": event.get("timestamp"),
            "level": event.get("level"),
            "event": start,
            "clipped_bytes": size,
        })  # fmt: skip
        if _utf8_size(text) <= MAX_EVENT_BYTES or not start:
            return text
        clip //= 2


def capture(holder: Holder) -> contextvars.Token[Holder | None]:
    """Make `holder` this thread's (or task's) run until `release`: what is logged here
    carries its fields, and is kept in `holder.logs` if it keeps logs."""
    return _current.set(holder)


def release(token: contextvars.Token[Holder | None]) -> None:
    _current.reset(token)


def _current_log() -> RunLog | None:
    holder = _current.get()
    if holder is None or not holder.keeps_logs:
        return None
    log = holder.logs
    if log is None:
        log = holder.logs = RunLog()
    return log


def keeping() -> bool:
    """Whether a run log is current here: an event logged now, at a level kept, goes in."""
    holder = _current.get()
    return holder is not None and holder.keeps_logs


def run_fields() -> dict[str, Any] | None:
    """The fields of the run whose handler runs on this thread (or task), if any."""
    holder = _current.get()
    return None if holder is None else holder.run_fields()


def utc_timestamp() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def capture_json_line(text: str) -> None:
    """The JSON line of an event, as the tick writes it on stderr (or would, at its
    --log-level), into the current run log.

    Where events are JSON lines, the line is made once for both: `cronjob.log` hands it
    here before writing it, for an event at a level kept.
    """
    log = _current_log()
    if log is not None:
        log.add_json(text)


def capture_structlog_event(_logger: Any, method: str, event_dict: dict[str, Any]) -> Any:
    """A structlog processor, where events are not JSON lines (a terminal's console): the
    event, as a JSON line would carry it, into the current run log."""
    log = _current_log()
    if log is not None:
        event = dict(event_dict)
        event["level"] = event.get("level") or method
        event["timestamp"] = utc_timestamp()  # the console's is a local clock time
        log.add(event)
    return event_dict


_factory_installed: Any = None  # the record factory this module installed, if any


def capture_logging_records(level: int = logging.INFO) -> None:
    """Standard `logging` records created while a run log is current go into it too, at
    `level` or more severe.

    Through the record factory, not a handler: where records end up (a handler of the
    app's, Python's last-resort output to stderr) stays as it was.
    """
    global _factory_installed, _record_level
    _record_level = level
    if _factory_installed is not None and logging.getLogRecordFactory() is _factory_installed:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if record.levelno >= _record_level:
            log = _current_log()
            if log is not None:
                log.add_record(record, _current.get().run_fields())  # type: ignore[union-attr]
        return record

    logging.setLogRecordFactory(factory)
    _factory_installed = factory


def _record_event(record: logging.LogRecord) -> dict[str, Any]:
    event: dict[str, Any] = {
        "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z"),
        "level": record_level(record),
        "event": record_message(record),
    }
    event.update(record_fields(record))
    return event


_RECORD_LEVELS = (
    (logging.CRITICAL, "critical"),
    (logging.ERROR, "error"),
    (logging.WARNING, "warning"),
    (logging.INFO, "info"),
)


def record_level(record: logging.LogRecord) -> str:
    """A record's level as structlog names it: a library's own level (TRACE at 5,
    NOTICE at 25) reads as the standard level below it."""
    levelno = record.levelno
    for number, name in _RECORD_LEVELS:
        if levelno >= number:
            return name
    return "debug"


def record_message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a library's bad format string must not lose the record
        return str(record.msg)


# What every record has, and the keys of an event of ours: the rest of a record's
# attributes came from `extra=`, and are its fields.
_RECORD_ATTRIBUTES = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys()
    | {"message", "asctime", "taskName", "timestamp", "level", "event", "logger", "exception"}
)


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """A standard `logging` record's logger, the fields given with `extra=`, and its
    exception's traceback, as an event's fields."""
    fields: dict[str, Any] = {"logger": record.name}
    for key, value in record.__dict__.items():
        if key not in _RECORD_ATTRIBUTES:
            fields[key] = value
    if record.exc_info and record.exc_info[0] is not None:
        fields["exception"] = "".join(traceback.format_exception(*record.exc_info))
    return fields


def event_line(event: dict[str, Any]) -> tuple[str, str | None]:
    """One kept event as `show` and the dashboard print it: its time of day, level, message
    and the fields beyond the run's own (the attempt's line says those) on one line; and its
    exception's text, if it has one. Both printable: a kept event is whatever was logged."""
    event = dict(event)
    moment = str(event.pop("timestamp", "") or "")
    level = str(event.pop("level", "") or "")
    message = str(event.pop("event", "") or "")
    exception = event.pop("exception", None)
    shown = [(key, value) for key, value in event.items() if key not in RUN_FIELDS]
    extra = "  ".join(f"{key}={_shown(value)}" for key, value in shown)
    line = f"{moment[11:23] or '?':<12}  {level:<7}  {message}" + (f"  {extra}" if extra else "")
    text = printable(str(exception).rstrip(), keep_newlines=True) if exception else None
    return printable(line.rstrip()), text


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
