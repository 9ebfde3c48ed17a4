"""How the dashboard's templates show values: times, ages, numbers, clipped text, JSON.

Each returns plain text; the template engine escapes it where it is placed. Nothing here
marks text as safe HTML.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from cronjob.health import seconds_text
from cronjob.text import one_line

# What a payload shows at most, with --show-payloads: enough to recognise it.
PAYLOAD_CHARS = 10_000
TRACEBACK_CHARS = 20_000
TRACE_ID_FIELD = "{trace_id}"


def when(moment: datetime | None) -> str:
    """A stored time in UTC, to the second; a dash for none."""
    if moment is None:
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def age(seconds: float | None) -> str:
    return "-" if seconds is None else seconds_text(max(0.0, seconds))


def since(moment: datetime | None, now: datetime) -> str:
    """How long before `now` (the database clock the page read) `moment` was."""
    if moment is None:
        return "-"
    seconds = (now - moment).total_seconds()
    return f"in {seconds_text(-seconds)}" if seconds < 0 else f"{seconds_text(seconds)} ago"


def iso(moment: datetime | None) -> str:
    """A stored time as ISO 8601 in UTC, to the second: what a `<time>` element carries."""
    if moment is None:
        return ""
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def relative(moment: datetime | None, now: datetime) -> str:
    """How far `moment` is from `now` (the database clock the page read), as a person says
    it at a glance: "45 s ago", "3 min ago", "in 20 s", "2 h ago"."""
    if moment is None:
        return "-"
    seconds = (now - moment).total_seconds()
    if abs(seconds) < 1:
        return "just now"
    text = _rounded(abs(seconds))
    return f"{text} ago" if seconds > 0 else f"in {text}"


def _rounded(seconds: float) -> str:
    if seconds < 60:
        return f"{int(seconds)} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    if seconds < 86400:
        hours, minutes = divmod(int(seconds // 60), 60)
        return f"{hours} h {minutes} min" if minutes and hours < 10 else f"{hours} h"
    return f"{int(seconds // 86400)} d"


def duration(started: datetime | None, ended: datetime | None) -> str:
    """How long from `started` to `ended`; a dash when either is unknown."""
    if started is None or ended is None:
        return "-"
    return seconds_text(max(0.0, (ended - started).total_seconds()))


def number(value: int | float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # a count summed as a float: 1,000, not 1,000.0
    return f"{value:,}"


def clip(text: str | None, width: int = 120) -> str:
    """Stored text on one line, cut to `width` characters."""
    if not text:
        return ""
    flat = one_line(text)
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def clip_block(text: str | None, limit: int = TRACEBACK_CHARS) -> str:
    """Stored text of several lines, its head kept when it is long."""
    if not text:
        return ""
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit:,} more)"


def as_json(value: Any, limit: int = PAYLOAD_CHARS) -> str:
    """A value as indented JSON, cut to `limit` characters."""
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
    return clip_block(text, limit)


def checked_trace_url_template(template: str) -> str:
    """A tracing UI's URL of a trace, `{trace_id}` where the id goes: an http or https URL
    with a host; BadInput otherwise (the value clipped in the message)."""
    from urllib.parse import urlsplit

    from cronjob.errors import BadInput

    shown = clip(template, 100)
    if TRACE_ID_FIELD not in template:
        raise BadInput(f"--trace-url-template {shown!r}: must contain {TRACE_ID_FIELD}")
    try:
        parts = urlsplit(template.replace(TRACE_ID_FIELD, "0"))
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(f"--trace-url-template {shown!r}: must be an http:// or https:// URL")
    if any(c in template for c in "\0\r\n\t "):
        raise BadInput(f"--trace-url-template {shown!r}: must hold no spaces or control characters")
    return template


def trace_id(traceparent: str | None) -> str | None:
    """The trace id of a W3C traceparent (`00-<trace id>-<span id>-<flags>`): the trace the
    enqueuer's request and every attempt's span belong to."""
    if not traceparent:
        return None
    parts = traceparent.split("-")
    return parts[1] if len(parts) >= 4 else None


def trace_url(template: str | None, trace: str | None) -> str | None:
    """The tracing UI's page of `trace`, the id URL-escaped into the template."""
    from urllib.parse import quote

    if template is None or trace is None:
        return None
    return template.replace(TRACE_ID_FIELD, quote(trace, safe=""))


# How the audit trail's selections read: each key a command records, as an operator says it.
SELECTION_WORDS = {
    "ids": "id",
    "status": "status",
    "type": "type",
    "tenant": "tenant",
    "error_type": "error type",
    "error_like": "error contains",
    "schedule": "schedule",
    "name": "name",
    "since": "changed since",
    "until": "changed before",
    "limit": "at most",
    "batch": "batch",
}
# Criteria whose word is its operator ("changed since X", "at most N"): no "=".
_OPERATOR_WORDS = frozenset({"error_like", "since", "until", "limit"})


def selection_words(selection: Any) -> str:
    """An audit entry's selection in words: "status = dead, type = reports.send, tenant =
    acme"; a list's values joined by "or". A key no command of today writes reads as its
    name, after the others."""
    if not isinstance(selection, dict) or not selection:
        return "-" if not selection else one_line(json.dumps(selection, ensure_ascii=False))
    # In the order of SELECTION_WORDS, whatever order the stored object keeps (jsonb's).
    order = {key: n for n, key in enumerate(SELECTION_WORDS)}
    parts = []
    for key, value in sorted(selection.items(), key=lambda kv: (order.get(kv[0], 99), kv[0])):
        word = SELECTION_WORDS.get(key, str(key).replace("_", " "))
        if isinstance(value, list):
            text = " or ".join(_word(v) for v in value) if value else "(none)"
        else:
            text = _word(value)
        parts.append(f"{word} {text}" if key in _OPERATOR_WORDS else f"{word} = {text}")
    return ", ".join(parts)


def _word(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str) and "T" in value and value[:4].isdigit():
        try:
            return iso(datetime.fromisoformat(value))
        except ValueError:
            pass
    return one_line(str(value))


FILTERS = {
    "when": when,
    "iso": iso,
    "relative": relative,
    "duration": duration,
    "selection_words": selection_words,
    "age": age,
    "number": number,
    "clip": clip,
    "clip_block": clip_block,
    "as_json": as_json,
}
