"""What a handler logged while it ran, kept with its attempt: the run log.

While a handler runs with capture on (the default; `@handler(..., capture_logs=False)`
switches it off for a type), its thread (or, for an `async def` handler, its task) has a
`RunLog` as the current one: every event logged through jobrunner's logging (`ctx.log`,
and any structlog logger it configured), as the JSON line the tick writes for it on
stderr, and every standard `logging` record created there, are added to it, besides
going where they always go. The tick writes the lot with
the attempt's outcome, in the same statement (table job_run_logs, migration 0019).

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
    """What a run log is kept on while its handler runs (the tick's Flight): made on the
    first event, so an attempt that logs nothing allocates nothing."""

    logs: RunLog | None


_current: contextvars.ContextVar[Holder | None] = contextvars.ContextVar(
    "jobrunner_run_log", default=None
)
_ENCODE = json.JSONEncoder(default=repr, ensure_ascii=False).encode


class RunLog:
    """The events of one attempt, encoded as JSON objects, newest last."""

    __slots__ = ("closed", "events", "size", "trimmed")

    def __init__(self) -> None:
        self.events: deque[str] | None = None
        self.size = 0
        self.trimmed = 0
        self.closed = False

    def __bool__(self) -> bool:
        return self.events is not None

    def add(self, event: dict[str, Any]) -> None:
        """An event's fields, as logged: made ready (text.json_ready), then encoded."""
        self.add_json(_ENCODE(json_ready(event)))

    def add_json(self, text: str) -> None:
        """An event already encoded as a JSON object from values made ready
        (text.json_ready): the line the tick wrote for it."""
        if self.closed:
            return
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
        self.closed = True

    def json(self) -> str:
        """The events as one JSON array, oldest first, as the finalize stores them.

        Checked on its own, before it joins the statement that finalizes a batch: an array
        PostgreSQL's jsonb would refuse (no event should be one) is replaced by a note, so
        that this run loses its log, and no other run its finalize.
        """
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
    """Keep what this thread (or task) logs in `holder.logs` until `release`."""
    return _current.set(holder)


def release(token: contextvars.Token[Holder | None]) -> None:
    _current.reset(token)


def _current_log() -> RunLog | None:
    holder = _current.get()
    if holder is None:
        return None
    log = holder.logs
    if log is None:
        log = holder.logs = RunLog()
    return log


def utc_timestamp() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def capture_json_line(text: str) -> None:
    """The JSON line of an event, as the tick writes it on stderr, into the current run log.

    Where events are JSON lines, the line is made once for both: `cronjob.log` hands it
    here before writing it.
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


def capture_logging_records() -> None:
    """Standard `logging` records created while a run log is current go into it too.

    Through the record factory, not a handler: where records end up (a handler of the
    app's, Python's last-resort output to stderr) stays as it was.
    """
    global _factory_installed
    if _factory_installed is not None and logging.getLogRecordFactory() is _factory_installed:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        log = _current_log()
        if log is not None:
            log.add(_record_event(record))
        return record

    logging.setLogRecordFactory(factory)
    _factory_installed = factory


def _record_event(record: logging.LogRecord) -> dict[str, Any]:
    try:
        message = record.getMessage()
    except Exception:  # a bad format string must not lose the record
        message = str(record.msg)
    event: dict[str, Any] = {
        "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z"),
        "level": record.levelname.lower(),
        "event": message,
        "logger": record.name,
    }
    if record.exc_info and record.exc_info[0] is not None:
        event["exception"] = "".join(traceback.format_exception(*record.exc_info))
    return event


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
