"""Parsing and validation of user input: durations, ids, timestamps, payloads.

Every function raises BadInput with one line naming the problem, so the command
line can exit 2 before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import IO, Any

from cronjob.errors import BadInput
from cronjob.text import one_line, redact

# "ms" before "s" and "m": the first unit the text ends with wins.
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DIGITS = frozenset("0123456789")

# Poison payloads are refused at the door: a handler should never be the first
# to discover that a document is gigabytes large or nested thousands deep.
MAX_PAYLOAD_BYTES = 1_000_000
MAX_PAYLOAD_DEPTH = 64
MAX_ID = 2**63 - 1
# An idempotency key is checked in bytes before the database sees it: its unique index
# holds keys of at most 2704 bytes and refuses a longer one with an obscure error.
MAX_IDEMPOTENCY_KEY_BYTES = 1000
# The most attempts a run may have, whoever asks: a handler, a Django task, a run enqueued,
# a schedule. Enough for any retry policy with backoff; the claim passes handlers' budgets
# as PostgreSQL integers, which a larger number would not fit.
MAX_ATTEMPTS = 1000
# What a bad value shown in an error message is clipped to.
EXCERPT_CHARS = 80
# The times jobrunner stores from its users: wide enough for any real schedule, narrow
# enough that every reading of them in any timezone stays inside Python's calendar.
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def comma_list(value: str | None) -> list[str]:
    """The items of a comma-separated option, stripped, empty ones left out."""
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def parse_duration(text: str | float | int, *, what: str = "duration") -> float:
    """`90s`, `5m`, `2h`, `1d`, `250ms`, or a bare number of seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        try:
            seconds = float(text)
        except OverflowError:
            seconds = float("inf")
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
                f"invalid {what} {excerpt(str(text))}: expected a number with an optional unit "
                "ms, s, m, h or d (e.g. 90s, 5m, 2h, 1d)"
            )
        seconds = float(number) * _UNIT_SECONDS.get(unit, 1.0)
    if seconds < 0 or seconds != seconds or seconds > 10 * 365 * 86400:
        raise BadInput(f"invalid {what} {excerpt(text)}: out of range")
    return seconds


def _split_unit(text: str) -> tuple[str, str | None]:
    # A hand-written split rather than a regular expression: durations are parsed on
    # every tick's start, and compiling a pattern costs more than the whole parse.
    body = text.strip()
    for unit in _UNIT_SECONDS:
        if body.endswith(unit):
            return body[: -len(unit)].rstrip(), unit
    return body, None


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """A bad value as an error message shows it: quoted, on one line, at most about `limit`
    characters. Messages never carry a long value whole: it would drown the line, and every
    message is searched for passwords before it is printed."""
    if isinstance(value, str):
        # Passwords out first: a URL clipped before its @ no longer shows where its password
        # ends. Of a value of megabytes, only a prefix well past the part shown is read.
        value = redact(value[: limit * 16])
        # Clipped after repr(), whose escapes (\U0001f600) can make one character ten.
        shown = repr(value[:limit])
        if len(value) > limit or len(shown) > limit + 2:
            shown = shown[: limit - 4] + "..." + shown[0]
        return shown
    if isinstance(value, (list, tuple)):
        return "a JSON array"
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        # repr() of an integer of thousands of digits raises, and is no use to read anyway.
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _integer_text(value: Any) -> str | None:
    """`value` as plain ASCII digits with an optional leading minus, or None.

    Python's int() also reads `1_0` as 10, and digits of any script, so an operator's typo
    could name another run; ids, counts, limits and sizes are written in ASCII alone.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        # Past 64 bits, out of every range here; str() would refuse thousands of digits.
        return str(value) if value.bit_length() <= 64 else "9" * 20
    if not isinstance(value, str):
        return None
    text = value.strip()
    digits = text[1:] if text.startswith("-") else text
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    return text


def _bounded_int(text: str, low: int, high: int) -> int | None:
    # Leading zeros aside, a number longer than the bounds' digits is out of range; int()
    # is never asked to convert thousands of digits (it refuses past 4,300 with a ValueError).
    sign = "-" if text.startswith("-") else ""
    digits = text.lstrip("-").lstrip("0") or "0"
    if len(digits) > max(len(str(abs(low))), len(str(abs(high)))):
        return None
    number = int(sign + digits)
    return number if low <= number <= high else None


def parse_integer(value: Any, *, what: str, low: int, high: int) -> int:
    """An integer from `low` to `high`, given as an int or as plain ASCII digits."""
    text = _integer_text(value)
    if text is None:
        raise BadInput(f"invalid {what} {excerpt(value)}: expected an integer in ASCII digits")
    number = _bounded_int(text, low, high)
    if number is None:
        raise BadInput(f"invalid {what} {excerpt(value)}: expected an integer from {low} to {high}")
    return number


def parse_id(value: Any, *, what: str = "run id") -> int:
    """A row id: a positive integer that fits a bigint."""
    text = _integer_text(value)
    number = None if text is None else _bounded_int(text, 1, MAX_ID)
    if number is None:
        raise BadInput(f"invalid {what} {excerpt(value)}: expected a positive integer")
    return number


def parse_run_id(text: str | int) -> int:
    return parse_id(text, what="run id")


def parse_run_ids(values: Iterable[str | int]) -> list[int]:
    """The run ids a command was given, each once, in the order given."""
    return list(dict.fromkeys(parse_run_id(value) for value in values))


def parse_statuses(
    value: str | None, *, allowed: Sequence[str] | None = None, command: str = "select"
) -> tuple[str, ...]:
    """The run statuses a `--status` option names, each once, in the order given; () if none.

    A name that is no status is refused in the same words by every command; with
    `allowed`, so is a status `command` does not act on.
    """
    # Here rather than at the top: the models are no part of an idle tick's imports.
    from cronjob.models import Status

    known = [status.value for status in Status]
    chosen = tuple(dict.fromkeys(comma_list(value)))
    for name in chosen:
        if name not in known:
            raise BadInput(f"unknown status {excerpt(name)}: expected one of {', '.join(known)}")
        if allowed is not None and name not in allowed:
            raise BadInput(f"cannot {command} {name} runs: --status takes {', '.join(allowed)}")
    return chosen


def parse_count(value: Any, *, what: str, maximum: int = 2**31 - 1) -> int:
    """A count, limit or size: zero or more."""
    return parse_integer(value, what=what, low=0, high=maximum)


def parse_positive_int(value: Any, *, what: str, maximum: int = 2**31 - 1) -> int:
    return parse_integer(value, what=what, low=1, high=maximum)


def parse_max_attempts(value: Any, *, what: str = "max attempts") -> int:
    return parse_integer(value, what=what, low=1, high=MAX_ATTEMPTS)


def parse_int(value: Any, *, what: str) -> int:
    return parse_integer(value, what=what, low=-(2**31), high=2**31 - 1)


def parse_timestamp(text: str, *, what: str = "timestamp") -> datetime:
    """An ISO-8601 timestamp within `EARLIEST`..`LATEST`; one without an offset is UTC."""
    if not isinstance(text, str):
        raise BadInput(f"invalid {what} {excerpt(text)}: expected an ISO-8601 string")
    try:
        # Anything longer than the longest ISO-8601 form is not one: no need to parse it.
        if len(text) > 64:
            raise ValueError(text)
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadInput(
            f"invalid {what} {excerpt(text)}: expected ISO-8601, e.g. 2026-01-05T09:00:00+01:00"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return check_time_in_range(value, what=what, shown=text)


def check_time_in_range(value: datetime, *, what: str, shown: Any = None) -> datetime:
    """Refuse a time outside `EARLIEST`..`LATEST`.

    PostgreSQL stores times far beyond Python's years 1 to 9999, and one such row would make
    every reader that loads it fail; the bounds also keep any local reading of a stored time,
    in any timezone, inside the calendar.
    """
    try:
        inside = EARLIEST <= value <= LATEST
    except (OverflowError, TypeError):
        inside = False
    if not inside:
        raise BadInput(
            f"invalid {what} {excerpt(value.isoformat() if shown is None else shown)}: "
            f"out of range (from {EARLIEST:%Y-%m-%d} to {LATEST:%Y-%m-%d} UTC)"
        )
    return value


def check_text(
    value: Any,
    *,
    what: str,
    max_length: int = 1000,
    allow_empty: bool = False,
    max_bytes: int | None = None,
) -> str:
    if not isinstance(value, str):
        raise BadInput(f"invalid {what} {excerpt(value)}: expected a string")
    if "\x00" in value:
        raise BadInput(f"invalid {what}: contains a NUL character")
    if not allow_empty and not value.strip():
        raise BadInput(f"invalid {what}: must not be empty")
    if len(value) > max_length:
        raise BadInput(f"invalid {what} {excerpt(value)}: longer than {max_length} characters")
    if max_bytes is not None and len(value.encode("utf-8", "surrogatepass")) > max_bytes:
        raise BadInput(f"invalid {what} {excerpt(value)}: longer than {max_bytes} bytes in UTF-8")
    if not _is_utf8(value):
        raise BadInput(f"invalid {what} {excerpt(value)}: contains an unpaired surrogate")
    return value


def read_text(stream: IO[bytes], limit: int, *, source: str) -> str:
    """At most `limit` bytes of UTF-8 text from `stream`, which is read no further: a file
    of any size, /dev/zero included, costs at most the limit to refuse."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise BadInput(f"{source} too large: more than {limit} bytes")
    return decode_text(data, source=source)


def decode_text(data: bytes, *, source: str) -> str:
    """`data` as UTF-8 text, or a one-line BadInput saying where it is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{source} is not UTF-8 text (invalid byte at offset {exc.start})") from None


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
        raise BadInput(f"invalid JSON in {source}: {one_line(str(exc))}") from None


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


def _payload_encoder() -> Callable[[Any], str]:
    """_ENCODER.encode, less the Python it runs around the C encoder on every call: most of
    its cost for a small payload, paid once a run by a bulk enqueue. The C encoder is made
    anew for each payload, with marks of its own, so that it still refuses a circular one
    (and the threads of an application can encode at once)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator on this interpreter
        return _ENCODER.encode
    enc = _ENCODER
    settings = (
        enc.default,
        json.encoder.encode_basestring,
        enc.indent,
        enc.key_separator,
        enc.item_separator,
        enc.sort_keys,
        enc.skipkeys,
        enc.allow_nan,
    )

    def encode(value: Any) -> str:
        return "".join(make({}, *settings)(value, 0))

    return encode


_encode = _payload_encoder()


def encode_payload(value: Any, *, source: str = "payload") -> str:
    """The payload as JSON text, once checked: depth, size, and what jsonb can store."""
    try:
        text = _encode(value)
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
    if text.isascii():  # a flag of the string: no pass over it
        return True
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
                    raise BadInput(f"{source} has a non-string object key {excerpt(key)}")
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


# A check-in URL: the column holds at most this many characters (migration 0013).
MAX_PING_URL_LENGTH = 2048


def ping_url_problem(value: Any) -> str | None:
    """What makes `value` no check-in ping URL (None: it is one), in words that quote
    none of it: the path and query of such a URL are usually its secret token.

    One rule for every door: `schedule add` and `sync` refuse what it names, and a tick
    skips a URL written into the table by other means that breaks it.
    """
    from urllib.parse import urlsplit

    if not isinstance(value, str):
        return f"expected an http:// or https:// URL, got {type(value).__name__}"
    if len(value) > MAX_PING_URL_LENGTH:
        return f"longer than {MAX_PING_URL_LENGTH} characters"
    if any(c.isspace() or not c.isprintable() for c in value):
        return "spaces or control characters in it"
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        return "not a URL: a bad port or brackets"
    if parts.scheme not in ("http", "https"):
        return "expected an http:// or https:// URL"
    if not parts.hostname:
        return "expected an http:// or https:// URL with a host"
    return None


def check_ping_url(value: Any, *, what: str) -> str:
    """`value` if it is a check-in ping URL (`ping_url_problem`); else one-line BadInput."""
    problem = ping_url_problem(value)
    if problem is None:
        return value
    if isinstance(value, str) and len(value) <= MAX_PING_URL_LENGTH:
        raise BadInput(f"invalid {what} {excerpt(value)}: {problem}")
    raise BadInput(f"invalid {what}: {problem}")
