"""What a cron expression says: the gate in front of croniter, and the values each field allows.

croniter turns each field into the set of values it allows. It reads more than cron does, so
a small gate in front of it (`_cron_item`) refuses what cron refuses, naming the field, and
hands croniter each field spelled so that both read it alike.

Day-of-month and day-of-week combine as Vixie cron combines them (see the package docstring);
`Expanded` holds the result as sets, and finds the next (or previous) matching wall-clock
minute in a few lookups. This module is the package's only reader of croniter: the field
expansion, and croniter's own walk of the same expression (`croniter_walls`) for the ends of
the calendar, where `cronjob.cron.walk` hands over to it.
"""

from __future__ import annotations

import copy
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import MAXYEAR, MINYEAR, date, datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from croniter import croniter

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
_MINUTE = timedelta(minutes=1)
# croniter searches this many years for the next match before giving up. The longest gap a
# valid expression can have is eight years (29 February across 2100); this keeps a bug from
# turning into a long spin.
_MAX_YEARS_BETWEEN_MATCHES = 10
# The years `Expanded` walks on its own. Every accepted expression fires at least once in any
# eight years, so inside these bounds croniter would find the same wall times well within its
# horizon; only near the ends of the calendar, where that horizon and datetime's range decide
# when the stream stops, is croniter asked.
_WALKED_YEARS = range(
    MINYEAR + _MAX_YEARS_BETWEEN_MATCHES + 1, MAXYEAR - _MAX_YEARS_BETWEEN_MATCHES
)


class CronError(ValueError):
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
class Expanded:
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
    def of(cls, fields: Sequence[frozenset[int]], either_day: bool) -> Expanded:
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
class Cron:
    """A validated expression.

    `expression` is the normalized text users see and the database stores. `expanded` is what
    it matches. `croniter_text` is the same schedule with every restricted field spelled as a
    plain list of numbers, so that croniter, which walks near the ends of the calendar, is
    never asked to interpret syntax whose meaning differs between cron dialects.
    """

    expression: str
    expanded: Expanded
    croniter_text: str
    either_day: bool
    wildcard: bool


def quoted(text: str) -> str:
    from cronjob.text import redact

    # Passwords out before clipping: a URL clipped before its @ no longer shows where its
    # password ends. repr() escapes newlines and control characters, which keeps every
    # message on one line.
    text = redact(text[:1280])
    if len(text) > 80:
        text = text[:77] + "..."
    return repr(text)


def _invalid(expression: str, problem: str) -> CronError:
    return CronError(f"invalid cron expression {quoted(expression)}: {problem}")


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
        raise _FieldError(f"{field.name} value {quoted(token)} is not {kind}{why}")
    value = _small_number(token)
    if not field.low <= value <= field.high:
        shown = value if value <= _LARGEST_CRON_NUMBER else quoted(token)
        raise _FieldError(f"{field.name} value {shown} out of range ({field.low}-{field.high})")
    return value


def _step(field: _Field, digits: str) -> int:
    if not _NUMBER.fullmatch(digits) or (step := _small_number(digits)) == 0:
        raise _FieldError(f"{field.name} step {quoted(digits)} is not a positive number")
    if step > _LARGEST_CRON_NUMBER:
        # A step longer than its field is still cron (it fires at the field's first value);
        # a step cron cannot read is not, and is refused rather than read as that value.
        raise _FieldError(
            f"{field.name} step {quoted(digits)} is too large: "
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
        return field_values(index, text)
    except _FieldError as exc:
        raise _invalid(expression, str(exc)) from None


def _backwards(
    field: _Field, start_text: str, end_text: str, first: int, last: int, stepped: str
) -> str:
    """Why a range such as ``fri-mon`` is refused, with the spelling cron accepts for it."""
    span = f"{start_text}-{end_text}"
    if stepped:
        return f"{field.name} range {quoted(span)} goes backwards"
    if field is _FIELDS[_DOW_FIELD]:
        # Sunday is both 0 and 7: the part up to the week's end takes it, the rest starts Monday.
        head = f"{start_text}-7" if first < 7 else "7"
        tail = {0: "", 1: end_text}.get(last, f"{'1' if end_text.isdigit() else 'mon'}-{end_text}")
    else:
        head, tail = _spelled(first, field.high), _spelled(field.low, last)
    spelling = ",".join(part for part in (head, tail) if part)
    return f"{field.name} range {quoted(span)} wraps around; cron spells it {quoted(spelling)}"


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
        raise _FieldError(f"empty item in {field.name} field {quoted(text)}")
    span, slash, step_text = item.partition("/")
    step = f"/{_step(field, step_text)}" if slash else ""
    if span == "*":
        # As a range: croniter refuses a star in a list (``*,5``), which cron reads as all.
        first, last = field.low, field.high
    elif "-" in span:
        start_text, _, end_text = span.partition("-")
        if not start_text or not end_text:
            raise _FieldError(f"{field.name} range {quoted(span)} lacks a bound")
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
def field_values(index: int, text: str) -> frozenset[int]:
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
        raise _FieldError(f"{field.name} field {quoted(text)} is not valid") from None
    values = expanded[index]
    if values == ["*"]:
        # croniter writes a field that allows every value as "*" (and Sunday as 0 alone).
        last = 6 if index == _DOW_FIELD else field.high
        return frozenset(range(field.low, last + 1))
    if nth_weekdays or not all(isinstance(value, int) for value in values):
        raise _FieldError(f"{field.name} field {quoted(text)} is not valid")
    return frozenset(values)


@lru_cache(maxsize=4096)
def compile_expression(expression: str) -> Cron:
    text = " ".join(expression.split())
    if not text:
        raise CronError("empty cron expression")
    if text.startswith("@"):
        alias = text.lower()
        if alias == "@reboot":
            raise CronError(
                "unsupported cron alias '@reboot': only time-based schedules can be materialized"
            )
        if alias not in _ALIASES:
            names = ", ".join(_ALIASES)
            raise CronError(f"unknown cron alias {quoted(text)} (expected one of {names})")
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
        raise CronError(
            f"cron expression {quoted(expression)} never fires: "
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
    return Cron(
        expression=text.lower(),
        expanded=Expanded.of(expanded, either_day and not days_never_occur),
        croniter_text=" ".join(parts),
        either_day=either_day and not days_never_occur,
        wildcard=fields[_MINUTE_FIELD].startswith("*") or fields[_HOUR_FIELD].startswith("*"),
    )


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


def croniter_walls(cron: Cron, start: datetime, forward: bool) -> Iterator[datetime]:
    """What `walk.walls` yields, found by croniter: near the ends of the calendar, where it
    stops."""
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
