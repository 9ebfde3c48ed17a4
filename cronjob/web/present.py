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


def number(value: int | float | None) -> str:
    return "-" if value is None else f"{value:,}"


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


FILTERS = {
    "when": when,
    "age": age,
    "number": number,
    "clip": clip,
    "clip_block": clip_block,
    "as_json": as_json,
}
