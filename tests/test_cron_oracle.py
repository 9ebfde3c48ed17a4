"""Our calendar against an independent implementation of Debian/Vixie cron: cronsim.

cronsim mimics Debian cron's daylight-saving handling (a minute or hour field starting with
``*`` makes a wildcard job; any other job runs at a fixed time) and its day-field rule (a day
field starting with ``*`` makes the two day fields combine with AND). Every case here asks both
for the next fire times from the same start and expects the same instants. Cases are seeded
random draws, so a failure names an expression, zone and start that can be replayed.

Transitions are found by scanning zoneinfo in this file, not by the code under test.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from itertools import islice
from zoneinfo import ZoneInfo

import pytest

from cronjob.cron import CronError, next_after, validate_expression

cronsim = pytest.importorskip("cronsim")

# Zones whose clocks move by a whole hour away from midnight. Where a transition is at midnight
# (America/Havana, America/Santiago) or moves by half an hour (Australia/Lord_Howe), cronsim's
# own walk misreads some wall times that Debian cron, reading the clock each minute, would run;
# those zones are checked against a minute-by-minute simulation in test_cron.py instead.
NORTHERN = ["Europe/Amsterdam", "Europe/London", "America/New_York", "America/Denver"]
SOUTHERN = ["Australia/Sydney", "Pacific/Auckland", "Australia/Adelaide", "Australia/Hobart"]
YEARS = (2025, 2026, 2027)


def _transitions(zone: str, year: int) -> list[datetime]:
    """Every instant in `year` at which `zone` changes its UTC offset (to the second)."""
    tz = ZoneInfo(zone)
    found = []
    moment = datetime(year, 1, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC)
    while moment < end:
        step = moment + timedelta(hours=1)
        if moment.astimezone(tz).utcoffset() != step.astimezone(tz).utcoffset():
            low, high = moment, step
            while high - low > timedelta(seconds=1):
                middle = low + (high - low) / 2
                if middle.astimezone(tz).utcoffset() == low.astimezone(tz).utcoffset():
                    low = middle
                else:
                    high = middle
            found.append(high.replace(microsecond=0))
        moment = step
    return found


def _is_plain_wall_time(moment: datetime, tz: ZoneInfo) -> bool:
    # cronsim walks fixed-time jobs on the naive wall clock, so a start read twice (or never)
    # has no single meaning there; starts are kept out of those periods.
    wall = moment.astimezone(tz).replace(tzinfo=None)
    return tz.utcoffset(wall) == tz.utcoffset(wall.replace(fold=1))


def _oracle(expr: str, zone: str, start: datetime, count: int) -> list[datetime]:
    tz = ZoneInfo(zone)
    walker = cronsim.CronSim(expr, start.astimezone(tz))
    return [moment.astimezone(UTC) for moment in islice(walker, count)]


MINUTES = ["*", "*/15", "*/20", "0", "30", "45", "0,30", "15-45/15", "5", "*/7", "10-20", "59"]
HOURS = ["*", "*/2", "*/3", "0", "1", "2", "3", "1-3", "0-23", "1,2", "23,0", "2-4/2", "*/1"]


def _dst_expression(rng: random.Random) -> str:
    minute, hour = rng.choice(MINUTES), rng.choice(HOURS)
    days = rng.choice(["* * *", "* * *", "* * *", "*/2 * *", "* * 0", "1-15 * *", "* * 1-5"])
    return f"{minute} {hour} {days}"


def _dst_cases() -> list[tuple[str, str, datetime]]:
    rng = random.Random(19)
    transitions = [
        (zone, instant)
        for zone in NORTHERN + SOUTHERN
        for year in YEARS
        for instant in _transitions(zone, year)
    ]
    cases = []
    while len(cases) < 1200:
        zone, instant = rng.choice(transitions)
        start = instant - timedelta(minutes=rng.randrange(0, 36 * 60))
        if _is_plain_wall_time(start, ZoneInfo(zone)):
            cases.append((_dst_expression(rng), zone, start))
    return cases


def test_dst_cases_cover_both_hemispheres_and_every_transition_year():
    cases = _dst_cases()
    zones = {zone for _, zone, _ in cases}
    assert set(NORTHERN) <= zones and set(SOUTHERN) <= zones
    assert {start.year for _, _, start in cases} >= set(YEARS)


def test_fire_times_across_daylight_saving_transitions_match_cronsim():
    disagreements = []
    cases = _dst_cases()
    for expr, zone, start in cases:
        expected = _oracle(expr, zone, start, 12)
        if next_after(expr, zone, start, 12) != expected:
            disagreements.append((expr, zone, start.isoformat()))
    assert disagreements == []


DAYS_OF_MONTH = ["*", "*/2", "*/3", "*/10", "1", "13", "1,15", "1-7", "10-20/5", "31", "29,30"]
DAYS_OF_WEEK = ["*", "*/2", "*/3", "sat", "fri", "mon,fri", "1-5", "0", "7", "sun,wed", "2-6/2"]
MONTHS = ["*", "*", "*/2", "2", "1,7", "jun-aug", "*/5"]


def _day_cases() -> list[tuple[str, str, datetime]]:
    rng = random.Random(16)
    cases = []
    while len(cases) < 600:
        dom, dow = rng.choice(DAYS_OF_MONTH), rng.choice(DAYS_OF_WEEK)
        if dom == "*" and dow == "*":
            continue
        expr = f"{rng.choice(['0', '30', '*/30'])} {rng.choice(['16', '0', '9-17/4'])} "
        expr += f"{dom} {rng.choice(MONTHS)} {dow}"
        try:
            validate_expression(expr)
        except CronError:
            continue  # never fires (the 31st of February): refused by both
        zone = rng.choice(["UTC", "Europe/Amsterdam", "Australia/Sydney"])
        start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=rng.randrange(4 * 525_600))
        if _is_plain_wall_time(start, ZoneInfo(zone)):
            cases.append((expr, zone, start))
    return cases


def test_day_of_month_and_day_of_week_combine_as_cronsim_combines_them():
    disagreements = []
    cases = _day_cases()
    for expr, zone, start in cases:
        if next_after(expr, zone, start, 10) != _oracle(expr.upper(), zone, start, 10):
            disagreements.append((expr, zone, start.isoformat()))
    assert sum(1 for expr, _, _ in cases if expr.split()[2].startswith("*/")) >= 50
    assert disagreements == []


@pytest.mark.parametrize("expr", ["0 0 31 2 *", "0 0 30 2 */2", "0 0 31 4,6 *"])
def test_expression_that_can_never_fire_is_refused_by_both(expr):
    with pytest.raises(CronError, match="never fires"):
        validate_expression(expr)
    with pytest.raises(cronsim.CronSimError):
        cronsim.CronSim(expr, datetime(2026, 1, 1))


@pytest.mark.parametrize("expr", ["0 0 * * fri-mon", "0 0 1 nov-mar *", "0 22-2 * * *"])
def test_wrap_around_range_is_refused_by_both(expr):
    with pytest.raises(CronError, match="wraps around"):
        validate_expression(expr)
    with pytest.raises(cronsim.CronSimError):
        cronsim.CronSim(expr.upper(), datetime(2026, 1, 1))


# croniter expands the fields; these are spellings it reads otherwise than cron (an equal range
# as the whole cycle, ``a/n`` in day-of-week stopping at Saturday).
@pytest.mark.parametrize("expr", ["5-5 * * * *", "0 0 * jan-jan *", "0 0 * * 1/2", "0 0 * * 7-7"])
def test_spellings_croniter_reads_otherwise_fire_as_cron_fires_them(expr):
    croniter = pytest.importorskip("croniter").croniter
    start = datetime(2026, 3, 1, tzinfo=UTC)
    expected = _oracle(expr.upper(), "UTC", start, 12)
    assert next_after(expr, "UTC", start, 12) == expected
    try:
        alone = croniter(expr, start)
        croniter_reading = [alone.get_next(datetime) for _ in range(12)]
    except ValueError:  # croniter's errors are ValueErrors
        croniter_reading = None
    assert croniter_reading != expected


# Each field of an expression, alone: the values croniter's expansion (behind the gate that
# hands it cron's spellings) allows, against the values cronsim's parser allows.
FIELD_LIMITS = [
    (0, 59, []),
    (0, 23, []),
    (1, 31, []),
    (1, 12, ["jan", "jun", "Oct", "DEC"]),
    (0, 7, ["sun", "mon", "Wed", "SAT"]),
]
CRONSIM_SETS = ["minutes", "hours", "days", "months", "weekdays"]


def _field_item(rng: random.Random, low: int, high: int, names: list[str]) -> str:
    def value() -> str:
        return rng.choice(names) if names and rng.random() < 0.3 else str(rng.randint(low, high))

    step = f"/{rng.choice([1, 2, 3, 5, 7, 13, 40])}" if rng.random() < 0.5 else ""
    shape = rng.random()
    if shape < 0.25:
        return "*" + step
    if shape < 0.5:
        return value() + step
    first, last = sorted(rng.sample(range(low, high + 1), 2))
    if rng.random() < 0.15:
        # An equal range, which croniter alone reads as the whole cycle. Without a step: with
        # one, cronsim reads it as ``a/n``, where Vixie cron's loop stops at ``a``.
        return f"{first}-{first}"
    return f"{first}-{last}{step}"


def test_every_field_expands_to_the_values_cronsim_reads():
    from cronjob.cron.fields import field_values

    rng = random.Random(5)
    disagreements = []
    for _ in range(3000):
        index = rng.randrange(5)
        low, high, names = FIELD_LIMITS[index]
        text = ",".join(_field_item(rng, low, high, names) for _ in range(rng.choice([1, 1, 2, 3])))
        expr = " ".join(text if other == index else "*" for other in range(5))
        expected = getattr(cronsim.CronSim(expr.upper(), datetime(2026, 1, 1)), CRONSIM_SETS[index])
        if index == 4:
            expected = {day % 7 for day in expected}
        if field_values(index, text) != expected:
            disagreements.append(expr)
    assert disagreements == []
