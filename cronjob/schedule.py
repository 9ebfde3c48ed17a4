"""When a schedule fires: cron expressions and timezones turned into real instants.

Pure functions, no I/O. Everything that creates runs, previews a schedule or computes a
definition's next fire time goes through the same two streams here (one walking forward, one
backward), so a preview is exactly what the materializer will create.

Expressions are classic five-field cron (minute hour day-of-month month day-of-week) plus the
aliases ``@hourly @daily @midnight @weekly @monthly @yearly @annually``. Each field accepts
``*``, numbers, ranges ``a-b``, lists ``a,b``, steps ``*/n``, ``a-b/n`` and ``a/n`` (from ``a``
to the field's end), and, for month and day-of-week, English three-letter names; day-of-week 7
is Sunday. A step may be longer than its field (it then fires at the field's first value, as
in cron), but no number may be larger than cron reads (2147483647). Non-standard extensions
(seconds, years, ``L``, ``W``, ``#``, ``?``, ``H``, ``R``) are refused: they are not portable
and ``R`` would not even be deterministic.

croniter turns each field into the set of values it allows. It reads more than cron does, so
a small gate in front of it (`_cron_item`) refuses what cron refuses, naming the field, and
hands croniter each field spelled so that both read it alike.

Day-of-month and day-of-week combine as Vixie cron combines them: when either field starts
with ``*`` (a bare ``*`` or a step such as ``*/2``) a day must match *both*, so
``0 16 */2 * sat`` fires on odd-dated Saturdays only; otherwise a day matches if *either*
matches, so ``0 0 13 * 5`` fires on every 13th and on every Friday. Wrap-around ranges
(``fri-mon``) are refused as cron refuses them; the message suggests the spelling cron accepts.

Matching wall-clock times are found by walking those sets here: the minutes croniter's own
iterator finds for the same expression, at a small fraction of its cost per step. The walk
applies cron's day-field rule (croniter's differs for stepped stars such as ``*/2``) and the
daylight-saving policy below, which croniter does not have. croniter walks only near the ends
of the calendar, where its search horizon decides when a stream stops.

Daylight-saving time follows Vixie cron. Cron fields are matched against the wall clock of the
schedule's timezone, and each matching wall time becomes real instants as follows:

* The minute and hour fields decide the kind of schedule. If either starts with ``*`` (``*``
  or ``*/n``) the schedule is a *wildcard* one (Debian cron: it runs more often than hourly);
  anything else (numbers, lists, ranges in both) is *fixed-time*.
* Wildcard schedules fire at every real instant whose wall-clock reading matches. In a
  repeated (fall-back) period a matching wall time is read twice and fires twice, because those
  are two different real hours; a wall time inside a skipped (spring-forward) gap is never read
  and does not fire, since the real hour simply is not there.
* Fixed-time schedules fire once per matching wall time. In a repeated period that is the first
  (earlier, still-summer-time) reading. A wall time inside a gap fires at the transition
  instant itself, i.e. right after the jump; several gap times collapse into that one run.

Results are always aware datetimes in UTC, strictly ascending and free of duplicates.
"""

from __future__ import annotations

import copy
import re
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import MAXYEAR, MINYEAR, UTC, date, datetime, timedelta
from functools import lru_cache
from itertools import islice, takewhile
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

if TYPE_CHECKING:
    from croniter import croniter

__all__ = [
    "CATCH_UP_POLICIES",
    "ScheduleError",
    "apply_catch_up",
    "latest_occurrence",
    "latest_occurrences",
    "next_after",
    "occurrences",
    "validate_expression",
    "validate_timezone",
]

CATCH_UP_POLICIES = ("latest", "all", "none")

_ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}

_MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
_DAY_NAMES = {
    name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}
# February counts 29 days: a schedule for the 29th fires in leap years, so it is not dead.
_LONGEST_MONTH = dict(enumerate((31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31), start=1))
_DAYS_IN_MONTH = {**_LONGEST_MONTH, 2: 28}  # and 29 in leap years

_NUMBER = re.compile(r"[0-9]+")
_TIMEZONE_KEY = re.compile(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*")
# Files that live in the zoneinfo directory but are not IANA zones: their meaning depends on
# the host (localtime), or they count leap seconds and would shift every run (right/).
_HOST_SPECIFIC_ZONES = ("localtime", "posixrules")
_HOST_SPECIFIC_PREFIXES = ("right/", "posix/")

_MINUTE = timedelta(minutes=1)
_RESOLUTION = timedelta(microseconds=1)
# Instants are computed as an epoch plus elapsed time: datetime.replace() parses its nine
# keywords by name on every call, several times the cost of the arithmetic, and the walk
# converts every wall time it passes.
_WALL_EPOCH = datetime(1970, 1, 1)
_UTC_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Offsets looked at around a boundary to find where wall-clock iteration must start. A wall time
# earlier than `after`'s own reading still fires after it when `after` sits in the first half
# of a repeated period; probing a few hours (and a day, for historic date-line moves) ahead
# finds the smaller offset in force there.
_OFFSET_PROBES = (timedelta(0), timedelta(hours=3), timedelta(hours=25))
# croniter searches this many years for the next match before giving up. The longest gap a
# valid expression can have is eight years (29 February across 2100); this keeps a bug from
# turning into a long spin.
_MAX_YEARS_BETWEEN_MATCHES = 10
# The years `_Expanded` walks on its own. Every accepted expression fires at least once in any
# eight years, so inside these bounds croniter would find the same wall times well within its
# horizon; only near the ends of the calendar, where that horizon and datetime's range decide
# when the stream stops, is croniter asked.
_WALKED_YEARS = range(
    MINYEAR + _MAX_YEARS_BETWEEN_MATCHES + 1, MAXYEAR - _MAX_YEARS_BETWEEN_MATCHES
)


class ScheduleError(ValueError):
    """A cron expression, timezone or catch-up policy that cannot be used.

    The message is a single line naming the problem, fit to show a user as it is.
    """


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int]


_FIELDS = (
    _Field("minute", 0, 59, {}),
    _Field("hour", 0, 23, {}),
    _Field("day-of-month", 1, 31, {}),
    _Field("month", 1, 12, _MONTH_NAMES),
    # 7 is accepted as Sunday, as in Vixie cron, and folded to 0 when the field is expanded.
    _Field("day-of-week", 0, 7, _DAY_NAMES),
)
_MINUTE_FIELD, _HOUR_FIELD, _DOM_FIELD, _MONTH_FIELD, _DOW_FIELD = range(5)
_DOM = _FIELDS[_DOM_FIELD]


@dataclass(frozen=True)
class _Expanded:
    """The wall-clock times an expression matches, as the values each field allows.

    Every expression this module accepts comes down to such sets, so the next (or previous)
    matching minute is a few lookups away. croniter finds the same minutes by interpreting its
    expression afresh on every step, some hundreds of microseconds each: the better part of
    materializing thousands of schedules that share nothing.
    """

    minutes: tuple[int, ...]  # ascending, as are hours and months
    hours: tuple[int, ...]
    months: tuple[int, ...]
    hour_set: frozenset[int]
    month_set: frozenset[int]
    # Whether a date matches depends only on its day of the month and its day of the week:
    # ``day_table[day * 7 + weekday]`` (weekday 0 is Sunday) is 1 for the pairs that do.
    day_table: bytes

    @classmethod
    def of(cls, fields: Sequence[frozenset[int]], either_day: bool) -> _Expanded:
        """From the five fields' values; `either_day`: a day matching either day field fires."""
        minutes, hours, days, months, weekdays = fields
        return cls(
            minutes=tuple(sorted(minutes)),
            hours=tuple(sorted(hours)),
            months=tuple(sorted(months)),
            hour_set=hours,
            month_set=months,
            day_table=_day_table(days, weekdays, either_day),
        )

    def next_wall(self, wall: datetime) -> datetime | None:
        """The first matching wall time after `wall` (whole minutes); None past the walked years."""
        if wall.year not in _WALKED_YEARS:
            return None
        wall += _MINUTE
        year, month, day = wall.year, wall.month, wall.day
        if month in self.month_set and self.day_table[day * 7 + wall.toordinal() % 7]:
            hour = wall.hour
            if hour in self.hour_set:
                index = bisect_left(self.minutes, wall.minute)
                if index < len(self.minutes):
                    return datetime(year, month, day, hour, self.minutes[index])
            index = bisect_right(self.hours, hour)
            if index < len(self.hours):
                return datetime(year, month, day, self.hours[index], self.minutes[0])
        found = self._first_day(year, month, day + 1)
        if found is None:
            return None
        return datetime(*found, self.hours[0], self.minutes[0])

    def previous_wall(self, wall: datetime) -> datetime | None:
        """The last matching wall time before `wall` (whole minutes); None past the walked years."""
        if wall.year not in _WALKED_YEARS:
            return None
        wall -= _MINUTE
        year, month, day = wall.year, wall.month, wall.day
        if month in self.month_set and self.day_table[day * 7 + wall.toordinal() % 7]:
            hour = wall.hour
            if hour in self.hour_set:
                index = bisect_right(self.minutes, wall.minute)
                if index:
                    return datetime(year, month, day, hour, self.minutes[index - 1])
            index = bisect_left(self.hours, hour)
            if index:
                return datetime(year, month, day, self.hours[index - 1], self.minutes[-1])
        found = self._last_day(year, month, day - 1)
        if found is None:
            return None
        return datetime(*found, self.hours[-1], self.minutes[-1])

    def _first_day(self, year: int, month: int, day: int) -> tuple[int, int, int] | None:
        """The first matching date on or after the given one (`day` may run past the month)."""
        while year in _WALKED_YEARS:
            if month in self.month_set:
                last = _days_in_month(year, month)
                if day <= last:
                    # (`before` + n) % 7 is the weekday of day n of this month.
                    before = date(year, month, 1).toordinal() - 1
                    for candidate in range(day, last + 1):
                        if self.day_table[candidate * 7 + (before + candidate) % 7]:
                            return year, month, candidate
            index = bisect_right(self.months, month)
            if index < len(self.months):
                month = self.months[index]
            else:
                year, month = year + 1, self.months[0]
            day = 1
        return None

    def _last_day(self, year: int, month: int, day: int) -> tuple[int, int, int] | None:
        """The last matching date on or before the given one (`day` may be 0)."""
        while year in _WALKED_YEARS:
            if month in self.month_set:
                before = date(year, month, 1).toordinal() - 1
                for candidate in range(min(day, _days_in_month(year, month)), 0, -1):
                    if self.day_table[candidate * 7 + (before + candidate) % 7]:
                        return year, month, candidate
            index = bisect_left(self.months, month)
            if index:
                month = self.months[index - 1]
            else:
                year, month = year - 1, self.months[-1]
            day = 31
        return None


@lru_cache(maxsize=256)
def _day_table(days: frozenset[int], weekdays: frozenset[int], either_day: bool) -> bytes:
    # Cached: most schedules share their day fields (every day, weekdays, the first).
    return bytes(
        (day in days or weekday in weekdays)
        if either_day
        else (day in days and weekday in weekdays)
        for day in range(32)
        for weekday in range(7)
    )


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return _DAYS_IN_MONTH[month]


@dataclass(frozen=True)
class _Cron:
    """A validated expression.

    `expression` is the normalized text users see and the database stores. `expanded` is what
    it matches. `croniter_text` is the same schedule with every restricted field spelled as a
    plain list of numbers, so that croniter, which walks near the ends of the calendar, is
    never asked to interpret syntax whose meaning differs between cron dialects.
    """

    expression: str
    expanded: _Expanded
    croniter_text: str
    either_day: bool
    wildcard: bool


def _quoted(text: str) -> str:
    # repr() escapes newlines and control characters, which keeps every message on one line.
    if len(text) > 80:
        text = text[:77] + "..."
    return repr(text)


def _invalid(expression: str, problem: str) -> ScheduleError:
    return ScheduleError(f"invalid cron expression {_quoted(expression)}: {problem}")


class _FieldError(ValueError):
    """A problem with one field, told without the expression it is part of."""


# Quartz- and Jenkins-style tokens that croniter reads and cron does not: last day ``L``,
# nearest weekday ``15W``, last weekday ``L5``, nth weekday ``5#3``, ``?``, hashed ``H`` and
# random ``R``.
_EXTENSION = re.compile(
    r"[0-9]*l[0-9]*|lw|[0-9]+w|w[0-9]+|[0-9a-z]*#[0-9]*|\?|h(\(.*)?|r", re.IGNORECASE
)


def _field_value(field: _Field, token: str) -> int:
    if token.lower() in field.names:
        return field.names[token.lower()]
    if not _NUMBER.fullmatch(token):
        kind = "a number or name" if field.names else "a number"
        why = "; cron has no L, W, #, ?, H or R" if _EXTENSION.fullmatch(token) else ""
        raise _FieldError(f"{field.name} value {_quoted(token)} is not {kind}{why}")
    value = _small_number(token)
    if not field.low <= value <= field.high:
        shown = value if value <= _LARGEST_CRON_NUMBER else _quoted(token)
        raise _FieldError(f"{field.name} value {shown} out of range ({field.low}-{field.high})")
    return value


def _step(field: _Field, digits: str) -> int:
    if not _NUMBER.fullmatch(digits) or (step := _small_number(digits)) == 0:
        raise _FieldError(f"{field.name} step {_quoted(digits)} is not a positive number")
    if step > _LARGEST_CRON_NUMBER:
        # A step longer than the field is cron: it fires at the first value. One cron cannot
        # read is not, however many digits it has.
        raise _FieldError(
            f"{field.name} step {_quoted(digits)} is too large: "
            f"cron reads numbers up to {_LARGEST_CRON_NUMBER}"
        )
    return step


# Cron reads every number into a C int: a larger one is not a number it can read. Checked
# without converting a long one, which int() refuses past 4,300 digits (and takes quadratic
# time up to there).
_LARGEST_CRON_NUMBER = 2**31 - 1


def _small_number(digits: str) -> int:
    """ASCII `digits` as an int; anything above `_LARGEST_CRON_NUMBER` as one more than it."""
    significant = digits.lstrip("0")
    if len(significant) > len(str(_LARGEST_CRON_NUMBER)):
        return _LARGEST_CRON_NUMBER + 1
    return min(int(significant or "0"), _LARGEST_CRON_NUMBER + 1)


def _expand_field(expression: str, index: int, text: str) -> frozenset[int]:
    try:
        return _field_values(index, text)
    except _FieldError as exc:
        raise _invalid(expression, str(exc)) from None


def _backwards(
    field: _Field, start_text: str, end_text: str, first: int, last: int, stepped: str
) -> str:
    """Why a range such as ``fri-mon`` is refused, with the spelling cron accepts for it."""
    span = f"{start_text}-{end_text}"
    if stepped:
        return f"{field.name} range {_quoted(span)} goes backwards"
    if field is _FIELDS[_DOW_FIELD]:
        # Sunday is both 0 and 7: the part up to the week's end takes it, the rest starts Monday.
        head = f"{start_text}-7" if first < 7 else "7"
        tail = {0: "", 1: end_text}.get(last, f"{'1' if end_text.isdigit() else 'mon'}-{end_text}")
    else:
        head, tail = _spelled(first, field.high), _spelled(field.low, last)
    spelling = ",".join(part for part in (head, tail) if part)
    return f"{field.name} range {_quoted(span)} wraps around; cron spells it {_quoted(spelling)}"


def _spelled(first: int, last: int) -> str:
    if first == last:
        return str(first)
    return f"{first},{last}" if last == first + 1 else f"{first}-{last}"


def _cron_item(field: _Field, item: str, text: str) -> str:
    """One item of a field checked against cron's grammar, in the spelling handed to croniter.

    The gate in front of croniter: it refuses what croniter accepts and cron does not
    (extensions, wrap-around ranges), names the field in every refusal, and spells what it
    lets through with numbers and ranges only. Three of cron's spellings mean something else
    to croniter, or nothing, so they are rewritten to ones both read alike: an equal range
    ``a-a`` (croniter: the whole cycle; cron: ``a``), ``a/n`` in day-of-week (croniter stops
    at 6; cron runs on to 7, Sunday again) and a star in a list (refused by croniter).
    """
    if not item:
        raise _FieldError(f"empty item in {field.name} field {_quoted(text)}")
    span, slash, step_text = item.partition("/")
    step = f"/{_step(field, step_text)}" if slash else ""
    if span == "*":
        # As a range: croniter refuses a star in a list (``*,5``), which cron reads as all.
        first, last = field.low, field.high
    elif "-" in span:
        start_text, _, end_text = span.partition("-")
        if not start_text or not end_text:
            raise _FieldError(f"{field.name} range {_quoted(span)} lacks a bound")
        first = _field_value(field, start_text)
        last = _field_value(field, end_text)
        if first > last:
            raise _FieldError(_backwards(field, start_text, end_text, first, last, slash))
    else:
        first = _field_value(field, span)
        # "a/n" runs from a to the end of the field, as in cronie and croniter.
        last = field.high if slash else first
    return str(first) if first == last else f"{first}-{last}{step}"


# Cached apart from whole expressions: thousands of distinct schedules are mostly made of the
# same few fields (``*``, ``0``, ``*/5``).
@lru_cache(maxsize=1024)
def _field_values(index: int, text: str) -> frozenset[int]:
    """The values field number `index` allows when it is written as `text`: croniter's expansion."""
    field = _FIELDS[index]
    items = ",".join(_cron_item(field, item, text) for item in text.split(","))
    # Imported here: an idle tick compiles no expression.
    from croniter import croniter

    # The field among stars, so that whatever croniter says is about this field alone.
    alone = " ".join(items if other == index else "*" for other in range(len(_FIELDS)))
    try:
        expanded, nth_weekdays = croniter.expand(alone)
    # Every croniter error is a ValueError; older releases let some through unwrapped.
    except ValueError:
        raise _FieldError(f"{field.name} field {_quoted(text)} is not valid") from None
    values = expanded[index]
    if values == ["*"]:
        # croniter writes a field that allows every value as "*" (and Sunday as 0 alone).
        last = 6 if index == _DOW_FIELD else field.high
        return frozenset(range(field.low, last + 1))
    if nth_weekdays or not all(isinstance(value, int) for value in values):
        raise _FieldError(f"{field.name} field {_quoted(text)} is not valid")
    return frozenset(values)


@lru_cache(maxsize=4096)
def _compile(expression: str) -> _Cron:
    text = " ".join(expression.split())
    if not text:
        raise ScheduleError("empty cron expression")
    if text.startswith("@"):
        alias = text.lower()
        if alias == "@reboot":
            raise ScheduleError(
                "unsupported cron alias '@reboot': only time-based schedules can be materialized"
            )
        if alias not in _ALIASES:
            names = ", ".join(_ALIASES)
            raise ScheduleError(f"unknown cron alias {_quoted(text)} (expected one of {names})")
        text = _ALIASES[alias]
    fields = text.split(" ")
    if len(fields) != len(_FIELDS):
        extra = "; seconds and years are not supported" if len(fields) in (6, 7) else ""
        problem = (
            "expected 5 fields (minute hour day-of-month month day-of-week), "
            f"got {len(fields)}{extra}"
        )
        raise _invalid(expression, problem)
    expanded = [_expand_field(expression, index, text) for index, text in enumerate(fields)]
    restricted = [field_text != "*" for field_text in fields]
    # Vixie cron reads the day fields together ("either") only when neither starts with a star.
    either_day = not (fields[_DOM_FIELD].startswith("*") or fields[_DOW_FIELD].startswith("*"))

    # Only a day-of-month that no listed month has can make a five-field expression dead, so
    # this check is exact and needs no search.
    longest = max(_LONGEST_MONTH[month] for month in expanded[_MONTH_FIELD])
    days_never_occur = min(expanded[_DOM_FIELD]) > longest
    if days_never_occur and not either_day:
        months = ",".join(str(month) for month in sorted(expanded[_MONTH_FIELD]))
        first_day = min(expanded[_DOM_FIELD])
        raise ScheduleError(
            f"cron expression {_quoted(expression)} never fires: "
            f"none of its months ({months}) has a day {first_day}"
        )

    parts = [
        ",".join(str(value) for value in sorted(values)) if is_restricted else "*"
        for values, is_restricted in zip(expanded, restricted, strict=True)
    ]
    if days_never_occur:
        # Under OR semantics a day-of-month that cannot occur contributes nothing, so the
        # schedule is its day-of-week alone. Saying so up front matters: croniter would
        # otherwise search its whole horizon for the impossible day on every step.
        parts[_DOM_FIELD] = "*"
        expanded[_DOM_FIELD] = frozenset(range(_DOM.low, _DOM.high + 1))
        restricted[_DOM_FIELD] = False
    return _Cron(
        expression=text.lower(),
        expanded=_Expanded.of(expanded, either_day and not days_never_occur),
        croniter_text=" ".join(parts),
        either_day=either_day and not days_never_occur,
        wildcard=fields[_MINUTE_FIELD].startswith("*") or fields[_HOUR_FIELD].startswith("*"),
    )


def _cron(expression: str) -> _Cron:
    if not isinstance(expression, str):
        raise ScheduleError(f"cron expression must be text, not {type(expression).__name__}")
    return _compile(expression)


def validate_expression(expr: str) -> str:
    """Check a cron expression and return its normalized form.

    Aliases become their five-field form, whitespace is collapsed and names are lower-cased,
    e.g. ``"@weekly"`` → ``"0 0 * * 0"``. Raises `ScheduleError` for anything that is not a
    five-field expression or a supported alias, for out-of-range values and for expressions
    that can never fire (``0 0 31 2 *``).
    """
    return _cron(expr).expression


@lru_cache(maxsize=1024)
def _zone(name: str) -> ZoneInfo:
    unknown = ScheduleError(f"unknown timezone {_quoted(name)}")
    if (
        not _TIMEZONE_KEY.fullmatch(name)
        or name in _HOST_SPECIFIC_ZONES
        or name.startswith(_HOST_SPECIFIC_PREFIXES)
    ):
        raise unknown
    try:
        return ZoneInfo(name)
    # zoneinfo reports a missing key, a directory ("America") and a non-TZif file differently.
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise unknown from exc


def validate_timezone(name: str) -> str:
    """Check an IANA timezone name (``Europe/Amsterdam``, ``UTC``) and return it stripped.

    Raises `ScheduleError` for empty or unknown names and for anything that is not a plain
    zone key (absolute or relative paths, host-specific files such as ``localtime``).
    """
    if not isinstance(name, str):
        raise ScheduleError(f"timezone must be text, not {type(name).__name__}")
    stripped = name.strip()
    if not stripped:
        raise ScheduleError("empty timezone name")
    _zone(stripped)
    return stripped


@lru_cache(maxsize=4096)
def _croniter_template(croniter_text: str, either_day: bool) -> croniter:
    # Imported here: most processes never walk near the ends of the calendar.
    from croniter import croniter

    return croniter(
        croniter_text,
        datetime(2000, 1, 1),
        day_or=either_day,
        max_years_between_matches=_MAX_YEARS_BETWEEN_MATCHES,
    )


def _walls(cron: _Cron, start: datetime, forward: bool) -> Iterator[datetime]:
    """Matching wall-clock times strictly after (or before) the naive wall time `start`.

    Wall times are naive on purpose: finding them is plain calendar arithmetic, and all
    daylight-saving decisions are made in `_resolve`, where they can follow Vixie cron.
    """
    step = cron.expanded.next_wall if forward else cron.expanded.previous_wall
    wall = start
    while (found := step(wall)) is not None:
        yield found
        wall = found
    yield from _croniter_walls(cron, wall, forward)


def _croniter_walls(cron: _Cron, start: datetime, forward: bool) -> Iterator[datetime]:
    """What `_walls` yields, found by croniter: near the ends of the calendar, where it stops."""
    from croniter import CroniterBadDateError

    # Parsing is the expensive part of building a croniter; a shallow copy of a parsed one
    # shares the expanded fields (croniter never mutates them) and gets its own position.
    walker = copy.copy(_croniter_template(cron.croniter_text, cron.either_day))
    walker.set_current(start, force=True)
    step = walker.get_next if forward else walker.get_prev
    while True:
        try:
            yield step(datetime)
        except (CroniterBadDateError, OverflowError, ValueError):
            # No further match within croniter's horizon, or the calendar ran out.
            return


def _offset_at(instant: datetime, zone: ZoneInfo) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    assert offset is not None
    return offset


def _transition(zone: ZoneInfo, before: datetime, after: datetime) -> datetime:
    """The instant in (before, after] at which `zone` leaves the offset it has at `before`."""
    old = _offset_at(before, zone)
    low, high = int(before.timestamp()), int(after.timestamp())
    # tzdata transitions fall on whole seconds, so bisecting whole seconds finds it exactly.
    while high - low > 1:
        middle = (low + high) // 2
        if _offset_at(datetime.fromtimestamp(middle, UTC), zone) == old:
            low = middle
        else:
            high = middle
    return datetime.fromtimestamp(high, UTC)


def _resolve(
    wall: datetime, zone: ZoneInfo, wildcard: bool
) -> tuple[tuple[datetime, ...], datetime, datetime]:
    """What one matching wall-clock time means in real time: (instants, earliest, latest).

    `instants` are the fire times it contributes (none, one, or two in a repeated period).
    `earliest` and `latest` bound every instant this wall time or any later (respectively,
    earlier) wall time can contribute; they let the merge in `_fire_times` release pending
    instants as soon as nothing can come before (after) them any more.
    """
    # The zone reads a naive wall time's fields and `fold` just as it would an aware one's.
    # Walls are whole minutes with fold 0; the second reading is built rather than replaced.
    second_reading = datetime(wall.year, wall.month, wall.day, wall.hour, wall.minute, fold=1)
    first_offset, second_offset = zone.utcoffset(wall), zone.utcoffset(second_reading)
    assert first_offset is not None and second_offset is not None
    earlier = _UTC_EPOCH + (wall - _WALL_EPOCH - first_offset)
    if first_offset == second_offset:
        return (earlier,), earlier, earlier
    later = _UTC_EPOCH + (wall - _WALL_EPOCH - second_offset)
    if first_offset > second_offset:
        # Repeated period: fold=0 is the first reading, in the offset before the clocks went
        # back; fold=1 the second one, an offset-change later.
        instants = (earlier, later) if wildcard else (earlier,)
        return instants, earlier, later
    # Skipped period: fold=0 applies the old offset and lands after the jump, fold=1 the new
    # offset and lands before it, so the jump lies between them.
    jump = _transition(zone, later, earlier)
    instants = () if wildcard else (jump,)
    return instants, jump, jump


def _wall_minute(instant: datetime, offset: timedelta) -> datetime:
    """The naive wall-clock minute a UTC `instant` reads as in `offset`."""
    reading = instant + offset
    return datetime(reading.year, reading.month, reading.day, reading.hour, reading.minute)


def _fire_times(
    cron: _Cron, zone: ZoneInfo, start: datetime, forward: bool, beyond: datetime
) -> Iterator[datetime]:
    """Distinct fire instants walking from wall time `start`, beyond the instant `beyond`.

    Forward they ascend and are later than `beyond`; backward they descend and are earlier.
    Wall times arrive in order, but in a repeated period the second readings of earlier wall
    times interleave with the first readings of later ones. Instants therefore wait in
    `pending` until the bound of the current wall time proves nothing can still precede them.
    """
    pending: list[datetime] = []
    # The last instant emitted: several gap times collapse into the same jump instant, and
    # each is emitted once. Starting from `beyond` also drops everything up to it.
    last = beyond
    for wall in _walls(cron, start, forward):
        instants, earliest, latest = _resolve(wall, zone, cron.wildcard)
        for instant in instants:
            insort(pending, instant)
        while pending and (pending[0] <= earliest if forward else pending[-1] >= latest):
            instant = pending.pop(0) if forward else pending.pop()
            if instant > last if forward else instant < last:
                last = instant
                yield instant
    for instant in pending if forward else reversed(pending):
        if instant > last if forward else instant < last:
            last = instant
            yield instant


def _forward_from(cron: _Cron, zone: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """Fire instants strictly after `after`, ascending."""
    # Wall times above `after`'s own reading are the obvious candidates, but in a repeated
    # period a lower wall time can still have its second reading ahead. Reading `after` in the
    # smallest offset in force over the next day starts early enough for both; the extra walk
    # only happens shortly before a fall-back.
    offset = min((after + probe).astimezone(zone).utcoffset() for probe in _OFFSET_PROBES)
    return _fire_times(cron, zone, _wall_minute(after, offset), True, after)


def _backward_from(cron: _Cron, zone: ZoneInfo, until: datetime) -> Iterator[datetime]:
    """Fire instants at or before `until`, descending."""
    # Mirror image of `_forward_from`: just after a fall-back, a wall time above `until`'s
    # reading may have had its first reading already.
    offset = max((until - probe).astimezone(zone).utcoffset() for probe in _OFFSET_PROBES)
    start = _wall_minute(until, offset) + _MINUTE
    # Earlier than the next representable instant means at or before `until`.
    return _fire_times(cron, zone, start, False, until + _RESOLUTION)


def _require_aware(name: str, moment: datetime) -> datetime:
    if not isinstance(moment, datetime) or moment.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got {moment!r}")
    return moment.astimezone(UTC)


def _require_count(name: str, count: int | None) -> None:
    if count is not None and count < 0:
        raise ValueError(f"{name} must not be negative, got {count}")


def occurrences(
    expr: str, tz: str, after: datetime, until: datetime, limit: int | None = None
) -> list[datetime]:
    """Every fire time t with ``after < t <= until``, ascending, as UTC datetimes.

    `after` and `until` are aware datetimes in any timezone and are compared as real instants,
    so an occurrence equal to `after` is excluded even across a daylight-saving change. With
    `limit`, only the first `limit` fire times are computed and returned.
    """
    cron, zone = _cron(expr), _zone(validate_timezone(tz))
    after, until = _require_aware("after", after), _require_aware("until", until)
    _require_count("limit", limit)
    if until <= after:
        return []
    due = takewhile(lambda instant: instant <= until, _forward_from(cron, zone, after))
    return list(islice(due, limit))


def next_after(expr: str, tz: str, after: datetime, count: int = 1) -> list[datetime]:
    """The next `count` fire times strictly after `after`, ascending, as UTC datetimes.

    Shares its stream with `occurrences`, so a preview shows exactly the runs the
    materializer will create.
    """
    cron, zone = _cron(expr), _zone(validate_timezone(tz))
    after = _require_aware("after", after)
    _require_count("count", count)
    return list(islice(_forward_from(cron, zone, after), count))


def latest_occurrences(
    expr: str, tz: str, after: datetime, until: datetime, count: int
) -> list[datetime]:
    """The last `count` fire times t with ``after < t <= until``, ascending, as UTC datetimes.

    Walks backward from `until`, so the work is proportional to `count` however far back
    `after` lies: catching up a minutely schedule after a month of downtime does not
    enumerate 43,000 occurrences. Equal to ``occurrences(expr, tz, after, until)[-count:]``.
    """
    cron, zone = _cron(expr), _zone(validate_timezone(tz))
    after, until = _require_aware("after", after), _require_aware("until", until)
    _require_count("count", count)
    if until <= after:
        return []
    found = []
    for instant in islice(_backward_from(cron, zone, until), count):
        if instant <= after:
            break
        found.append(instant)
    found.reverse()
    return found


def latest_occurrence(expr: str, tz: str, after: datetime, until: datetime) -> datetime | None:
    """The last fire time t with ``after < t <= until``, or None; see `latest_occurrences`."""
    latest = latest_occurrences(expr, tz, after, until, 1)
    return latest[0] if latest else None


def apply_catch_up(
    due: Sequence[datetime],
    policy: str,
    now: datetime,
    *,
    bound: int = 100,
    grace_seconds: float = 120,
) -> list[datetime]:
    """Choose which of the due fire times become runs, under a definition's catch-up policy.

    `due` is what `occurrences` returned for (high-water mark, `now`], ascending. Every due
    time was "missed" except possibly the newest, which is the one this tick exists for.

    * ``latest`` (the default policy): only the newest due time runs, once, however many were
      missed.
    * ``all``: every due time runs, but at most the newest `bound` of them.
    * ``none``: missed times are skipped. Only the newest due time runs, and only if it fired
      no more than `grace_seconds` before `now`, i.e. it is the occurrence of the current tick
      rather than a leftover from downtime. A tick delayed by more than the grace period
      therefore skips it too.
    """
    if policy not in CATCH_UP_POLICIES:
        raise ScheduleError(
            f"unknown catch-up policy {_quoted(str(policy))} (expected latest, all or none)"
        )
    if bound < 1:
        raise ValueError(f"bound must be at least 1, got {bound}")
    now = _require_aware("now", now)
    if not due:
        return []
    if policy == "all":
        return list(due[-bound:])
    newest = due[-1]
    if policy == "none" and now - newest > timedelta(seconds=grace_seconds):
        return []
    return [newest]
