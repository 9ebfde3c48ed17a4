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

Day-of-month and day-of-week combine as Vixie cron combines them: when either field starts
with ``*`` (a bare ``*`` or a step such as ``*/2``) a day must match *both*, so
``0 16 */2 * sat`` fires on odd-dated Saturdays only; otherwise a day matches if *either*
matches, so ``0 0 13 * 5`` fires on every 13th and on every Friday. Wrap-around ranges
(``fri-mon``) are refused as cron refuses them; the message suggests the spelling cron accepts.

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

The parts: `fields` reads an expression (croniter expands each field, behind a gate that
refuses what cron refuses) into the values each field allows; `walk` finds the wall-clock
times those values match and turns them into instants under the policy above. This module
holds the public functions, timezones and catch-up policies.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from itertools import islice, takewhile
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronjob.cron.fields import Cron, CronError, compile_expression, quoted
from cronjob.cron.walk import backward_from, forward_from

__all__ = [
    "CATCH_UP_POLICIES",
    "CronError",
    "apply_catch_up",
    "latest_occurrence",
    "latest_occurrences",
    "next_after",
    "occurrences",
    "validate_expression",
    "validate_timezone",
]

CATCH_UP_POLICIES = ("latest", "all", "none")

_TIMEZONE_KEY = re.compile(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*")
# Files that live in the zoneinfo directory but are not IANA zones: their meaning depends on
# the host (localtime), or they count leap seconds and would shift every run (right/).
_HOST_SPECIFIC_ZONES = ("localtime", "posixrules")
_HOST_SPECIFIC_PREFIXES = ("right/", "posix/")


def _cron(expression: str) -> Cron:
    if not isinstance(expression, str):
        raise CronError(f"cron expression must be text, not {type(expression).__name__}")
    return compile_expression(expression)


def validate_expression(expr: str) -> str:
    """Check a cron expression and return its normalized form.

    Aliases become their five-field form, whitespace is collapsed and names are lower-cased,
    e.g. ``"@weekly"`` → ``"0 0 * * 0"``. Raises `CronError` for anything that is not a
    five-field expression or a supported alias, for out-of-range values and for expressions
    that can never fire (``0 0 31 2 *``).
    """
    return _cron(expr).expression


@lru_cache(maxsize=1024)
def _zone(name: str) -> ZoneInfo:
    unknown = CronError(f"unknown timezone {quoted(name)}")
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

    Raises `CronError` for empty or unknown names and for anything that is not a plain
    zone key (absolute or relative paths, host-specific files such as ``localtime``).
    """
    if not isinstance(name, str):
        raise CronError(f"timezone must be text, not {type(name).__name__}")
    stripped = name.strip()
    if not stripped:
        raise CronError("empty timezone name")
    _zone(stripped)
    return stripped


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
    due = takewhile(lambda instant: instant <= until, forward_from(cron, zone, after))
    return list(islice(due, limit))


def next_after(expr: str, tz: str, after: datetime, count: int = 1) -> list[datetime]:
    """The next `count` fire times strictly after `after`, ascending, as UTC datetimes.

    Shares its stream with `occurrences`, so a preview shows exactly the runs the
    materializer will create.
    """
    cron, zone = _cron(expr), _zone(validate_timezone(tz))
    after = _require_aware("after", after)
    _require_count("count", count)
    return list(islice(forward_from(cron, zone, after), count))


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
    for instant in islice(backward_from(cron, zone, until), count):
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
        raise CronError(
            f"unknown catch-up policy {quoted(str(policy))} (expected latest, all or none)"
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
