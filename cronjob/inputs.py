"""Parsing and validation of user input: durations, ids, timestamps, payloads.

Every function raises BadInput with one line naming the problem, so the command
line can exit 2 before anything is written.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from cronjob.errors import BadInput

# "ms" before "s" and "m": the first unit the text ends with wins.
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DIGITS = frozenset("0123456789")

# Poison payloads are refused at the door: a handler should never be the first
# to discover that a document is gigabytes large or nested thousands deep.
MAX_PAYLOAD_BYTES = 1_000_000
MAX_PAYLOAD_DEPTH = 64
MAX_ID = 2**63 - 1


def parse_duration(text: str | float | int, *, what: str = "duration") -> float:
    """`90s`, `5m`, `2h`, `1d`, `250ms`, or a bare number of seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        number, unit = _split_unit(str(text))
        whole, _, fraction = number.partition(".")
        if (
            not whole
            or not _DIGITS.issuperset(whole)
            or not _DIGITS.issuperset(fraction)
            or (number.endswith("."))
        ):
            raise BadInput(
                f"invalid {what} {str(text)!r}: expected a number with an optional unit "
                "ms, s, m, h or d (e.g. 90s, 5m, 2h, 1d)"
            )
        seconds = float(number) * _UNIT_SECONDS.get(unit, 1.0)
    if seconds < 0 or seconds != seconds or seconds > 10 * 365 * 86400:
        raise BadInput(f"invalid {what} {text!r}: out of range")
    return seconds


def _split_unit(text: str) -> tuple[str, str | None]:
    # A hand-written split rather than a regular expression: durations are parsed on
    # every tick's start, and compiling a pattern costs more than the whole parse.
    body = text.strip()
    for unit in _UNIT_SECONDS:
        if body.endswith(unit):
            return body[: -len(unit)].rstrip(), unit
    return body, None


def parse_run_id(text: str | int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise BadInput(f"invalid run id {str(text)!r}: expected a positive integer") from None
    if not 0 < value <= MAX_ID:
        raise BadInput(f"invalid run id {str(text)!r}: expected a positive integer")
    return value


def parse_timestamp(text: str, *, what: str = "timestamp") -> datetime:
    """An ISO-8601 timestamp; one without an offset is taken as UTC."""

    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadInput(
            f"invalid {what} {text!r}: expected ISO-8601, e.g. 2026-01-05T09:00:00+01:00"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def parse_positive_int(value: Any, *, what: str, maximum: int = 2**31 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise BadInput(f"invalid {what} {value!r}: expected a positive integer")
    try:
        number = int(value)
    except ValueError:
        raise BadInput(f"invalid {what} {value!r}: expected a positive integer") from None
    if not 1 <= number <= maximum:
        raise BadInput(f"invalid {what} {value!r}: expected an integer from 1 to {maximum}")
    return number


def parse_int(value: Any, *, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise BadInput(f"invalid {what} {value!r}: expected an integer")
    try:
        number = int(value)
    except ValueError:
        raise BadInput(f"invalid {what} {value!r}: expected an integer") from None
    if not -(2**31) <= number < 2**31:
        raise BadInput(f"invalid {what} {value!r}: out of range")
    return number


def check_text(value: Any, *, what: str, max_length: int = 1000, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise BadInput(f"invalid {what} {value!r}: expected a string")
    if "\x00" in value:
        raise BadInput(f"invalid {what}: contains a NUL character")
    if not allow_empty and not value.strip():
        raise BadInput(f"invalid {what}: must not be empty")
    if len(value) > max_length:
        raise BadInput(f"invalid {what}: longer than {max_length} characters")
    return value


def parse_payload(text: str, *, source: str = "payload") -> Any:
    """Decode a JSON payload and check it is safe to store and hand to a handler."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_PAYLOAD_BYTES:
        raise BadInput(f"{source} too large: more than {MAX_PAYLOAD_BYTES} bytes of JSON")
    value = decode_json(text, source=source)
    check_payload(value, source=source)
    return value


def decode_json(text: str, *, source: str) -> Any:
    """Decode JSON text, naming `source` in the one-line error."""
    try:
        return loads(text)
    except RecursionError:
        raise BadInput(f"{source} nested deeper than {MAX_PAYLOAD_DEPTH} levels") from None
    except ValueError as exc:
        raise BadInput(f"invalid JSON in {source}: {_one_line(str(exc))}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# Built once: json.loads/json.dumps with options build a new coder on every call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def loads(text: str) -> Any:
    """json.loads, refusing NaN and Infinity, which are not JSON and jsonb cannot store."""
    return _DECODER.decode(text)


def check_payload(value: Any, *, source: str = "payload") -> Any:
    """Check an already-decoded payload: depth, size, and what jsonb can store."""
    encode_payload(value, source=source)
    return value


def encode_payload(value: Any, *, source: str = "payload") -> str:
    """The payload as JSON text, once checked: depth, size, and what jsonb can store."""
    try:
        text = _ENCODER.encode(value)
    except RecursionError:
        raise BadInput(f"{source} nested deeper than {MAX_PAYLOAD_DEPTH} levels") from None
    except (TypeError, ValueError):
        # The walk names the offending value precisely.
        _check_depth_and_text(value, source)
        raise BadInput(f"{source} is not JSON") from None
    if len(text) * 4 > MAX_PAYLOAD_BYTES and len(text.encode("utf-8", "surrogatepass")) > (
        MAX_PAYLOAD_BYTES
    ):
        raise BadInput(f"{source} too large: more than {MAX_PAYLOAD_BYTES} bytes of JSON")
    # The full walk only when the text cannot rule a problem out: too many
    # brackets to be sure of the depth, an escaped NUL, or a lone surrogate.
    if (
        text.count("[") + text.count("{") > MAX_PAYLOAD_DEPTH
        or "\\u0000" in text
        or not _is_utf8(text)
    ):
        _check_depth_and_text(value, source)
    return text


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_depth_and_text(root: Any, source: str) -> None:
    # Iterative so that a hostile document cannot exhaust the interpreter's stack.
    stack = [(root, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_PAYLOAD_DEPTH:
            raise BadInput(f"{source} nested deeper than {MAX_PAYLOAD_DEPTH} levels")
        if isinstance(value, str):
            _check_string(value, source)
        elif isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise BadInput(f"{source} has a non-string object key {key!r}")
                _check_string(key, source)
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, float) and (
            value != value or value in (float("inf"), -float("inf"))
        ):
            raise BadInput(f"{source} contains {value!r}, which is not valid JSON")
        elif value is not None and not isinstance(value, (bool, int, float)):
            raise BadInput(f"{source} contains a {type(value).__name__}, which is not JSON")


def _check_string(value: str, source: str) -> None:
    # PostgreSQL's jsonb cannot store U+0000; refuse it here with a clear message
    # rather than letting the insert fail halfway through a batch.
    if "\x00" in value:
        raise BadInput(
            f"{source} contains a NUL character (\\u0000), which PostgreSQL cannot store"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput(
            f"{source} contains an unpaired surrogate, which is not valid UTF-8"
        ) from None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def check_tenants_sql(text: str | None) -> str | None:
    """The tenant query as it will be embedded, or None; raises BadInput if unusable."""
    if text is None:
        return None
    query = text.strip()
    # A trailing semicolon is natural to type and harmless to drop; the query is embedded
    # as a subquery, where it would be a syntax error.
    while query.endswith(";"):
        query = query[:-1].rstrip()
    if not query:
        raise BadInput("empty tenant query: give a query whose first column is the tenant id")
    if "\x00" in query:
        raise BadInput("invalid tenant query: contains a NUL character")
    return query
