"""Specification of occurrence maths: which real instants a schedule fires at.

Expected instants are written out by hand in UTC from the 2026 tzdata transitions listed in
TRANSITIONS (which a test checks against zoneinfo), never computed by the code under test.
"""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta, timezone
from itertools import islice, pairwise
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from cronjob.cron import (
    CronError,
    apply_catch_up,
    latest_occurrence,
    latest_occurrences,
    next_after,
    occurrences,
    validate_expression,
    validate_timezone,
)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def utcs(*texts: str) -> list[datetime]:
    return [utc(text) for text in texts]


# zone, transition instant (UTC), wall clock just before -> just after
TRANSITIONS = [
    ("Europe/Amsterdam", "2026-03-29T01:00", "+01:00", "+02:00"),
    ("Europe/Amsterdam", "2026-10-25T01:00", "+02:00", "+01:00"),
    ("America/New_York", "2026-03-08T07:00", "-05:00", "-04:00"),
    ("America/New_York", "2026-11-01T06:00", "-04:00", "-05:00"),
    ("Australia/Sydney", "2026-04-04T16:00", "+11:00", "+10:00"),
    ("Australia/Sydney", "2026-10-03T16:00", "+10:00", "+11:00"),
    ("America/Santiago", "2026-04-05T03:00", "-03:00", "-04:00"),
    ("America/Santiago", "2026-09-06T04:00", "-04:00", "-03:00"),
    ("Australia/Lord_Howe", "2026-04-04T15:00", "+11:00", "+10:30"),
    ("Australia/Lord_Howe", "2026-10-03T15:30", "+10:30", "+11:00"),
    ("America/Havana", "2026-03-08T05:00", "-05:00", "-04:00"),
    ("America/Havana", "2026-11-01T05:00", "-04:00", "-05:00"),
]


def _offset(text: str) -> timedelta:
    sign = -1 if text[0] == "-" else 1
    hours, minutes = text[1:].split(":")
    return sign * timedelta(hours=int(hours), minutes=int(minutes))


@pytest.mark.parametrize(
    ("zone", "instant", "before", "after"),
    TRANSITIONS,
    ids=[f"{zone}-{instant[:10]}" for zone, instant, _, _ in TRANSITIONS],
)
def test_table_transitions_match_the_installed_tzdata(zone, instant, before, after):
    tz = ZoneInfo(zone)
    at = utc(instant)
    assert (at - timedelta(seconds=1)).astimezone(tz).utcoffset() == _offset(before)
    assert at.astimezone(tz).utcoffset() == _offset(after)


def test_tokyo_has_no_transition_in_2026():
    tz = ZoneInfo("Asia/Tokyo")
    offsets = {
        (utc("2026-01-01T00:00") + timedelta(days=day)).astimezone(tz).utcoffset()
        for day in range(366)
    }
    assert offsets == {timedelta(hours=9)}


# Each case: zone, schedule, window (after, until], expected fire times in UTC.
# Comments give the local reading of each expected instant.
DST_CASES = [
    # Europe/Amsterdam: 2026-03-29 02:00 CET -> 03:00 CEST; 2026-10-25 03:00 CEST -> 02:00 CET.
    pytest.param(
        "Europe/Amsterdam",
        "30 2 * * *",
        "2026-03-28T12:00",
        "2026-03-30T12:00",
        # 03-29 02:30 does not exist -> 03:00 CEST; 03-30 02:30 CEST
        ["2026-03-29T01:00", "2026-03-30T00:30"],
        id="amsterdam-spring-0230-runs-once-right-after-the-jump",
    ),
    pytest.param(
        "Europe/Amsterdam",
        "0,30 2 * * *",
        "2026-03-28T12:00",
        "2026-03-30T12:00",
        # both skipped times collapse into one run at 03:00 CEST
        ["2026-03-29T01:00", "2026-03-30T00:00", "2026-03-30T00:30"],
        id="amsterdam-spring-two-skipped-times-collapse-into-one-run",
    ),
    pytest.param(
        "Europe/Amsterdam",
        "0 * * * *",
        "2026-03-28T22:30",
        "2026-03-29T02:30",
        # 00:00 CET, 01:00 CET, (02:00 skipped), 03:00 CEST, 04:00 CEST
        ["2026-03-28T23:00", "2026-03-29T00:00", "2026-03-29T01:00", "2026-03-29T02:00"],
        id="amsterdam-spring-hourly-runs-every-real-hour",
    ),
    pytest.param(
        "Europe/Amsterdam",
        "30 2 * * *",
        "2026-10-24T12:00",
        "2026-10-26T12:00",
        # 10-25 02:30 CEST (first reading only), 10-26 02:30 CET
        ["2026-10-25T00:30", "2026-10-26T01:30"],
        id="amsterdam-fall-0230-runs-once-at-first-reading",
    ),
    pytest.param(
        "Europe/Amsterdam",
        "*/30 * * * *",
        "2026-10-24T23:30",
        "2026-10-25T02:00",
        # 02:00 CEST, 02:30 CEST, 02:00 CET, 02:30 CET, 03:00 CET
        [
            "2026-10-25T00:00",
            "2026-10-25T00:30",
            "2026-10-25T01:00",
            "2026-10-25T01:30",
            "2026-10-25T02:00",
        ],
        id="amsterdam-fall-half-hourly-runs-in-both-readings-of-the-repeated-hour",
    ),
    pytest.param(
        "Europe/Amsterdam",
        "0 * * * *",
        "2026-10-24T22:30",
        "2026-10-25T02:30",
        # 01:00 CEST, 02:00 CEST, 02:00 CET, 03:00 CET
        ["2026-10-24T23:00", "2026-10-25T00:00", "2026-10-25T01:00", "2026-10-25T02:00"],
        id="amsterdam-fall-hourly-runs-the-repeated-hour-twice",
    ),
    # America/New_York: 2026-03-08 02:00 EST -> 03:00 EDT; 2026-11-01 02:00 EDT -> 01:00 EST.
    pytest.param(
        "America/New_York",
        "30 2 * * *",
        "2026-03-07T12:00",
        "2026-03-09T12:00",
        # 03-08 02:30 does not exist -> 03:00 EDT; 03-09 02:30 EDT
        ["2026-03-08T07:00", "2026-03-09T06:30"],
        id="new-york-spring-0230-runs-once-right-after-the-jump",
    ),
    pytest.param(
        "America/New_York",
        "0 * * * *",
        "2026-03-08T05:30",
        "2026-03-08T08:30",
        # 01:00 EST, 03:00 EDT, 04:00 EDT
        ["2026-03-08T06:00", "2026-03-08T07:00", "2026-03-08T08:00"],
        id="new-york-spring-hourly-has-one-hour-fewer",
    ),
    pytest.param(
        "America/New_York",
        "30 1 * * *",
        "2026-10-31T12:00",
        "2026-11-02T12:00",
        # 11-01 01:30 EDT (first reading only), 11-02 01:30 EST
        ["2026-11-01T05:30", "2026-11-02T06:30"],
        id="new-york-fall-0130-runs-once-at-first-reading",
    ),
    pytest.param(
        "America/New_York",
        "*/30 * * * *",
        "2026-11-01T04:45",
        "2026-11-01T07:00",
        # 01:00 EDT, 01:30 EDT, 01:00 EST, 01:30 EST, 02:00 EST
        [
            "2026-11-01T05:00",
            "2026-11-01T05:30",
            "2026-11-01T06:00",
            "2026-11-01T06:30",
            "2026-11-01T07:00",
        ],
        id="new-york-fall-half-hourly-runs-in-both-readings-of-the-repeated-hour",
    ),
    # Australia/Sydney: 2026-04-05 03:00 AEDT -> 02:00 AEST; 2026-10-04 02:00 AEST -> 03:00 AEDT.
    pytest.param(
        "Australia/Sydney",
        "30 2 * * *",
        "2026-04-04T00:00",
        "2026-04-05T20:00",
        # 04-05 02:30 AEDT (first reading only), 04-06 02:30 AEST
        ["2026-04-04T15:30", "2026-04-05T16:30"],
        id="sydney-fall-0230-runs-once-at-first-reading",
    ),
    pytest.param(
        "Australia/Sydney",
        "0 * * * *",
        "2026-04-04T14:30",
        "2026-04-04T17:30",
        # 02:00 AEDT, 02:00 AEST, 03:00 AEST
        ["2026-04-04T15:00", "2026-04-04T16:00", "2026-04-04T17:00"],
        id="sydney-fall-hourly-runs-the-repeated-hour-twice",
    ),
    pytest.param(
        "Australia/Sydney",
        "30 2 * * *",
        "2026-10-03T00:00",
        "2026-10-04T20:00",
        # 10-04 02:30 does not exist -> 03:00 AEDT; 10-05 02:30 AEDT
        ["2026-10-03T16:00", "2026-10-04T15:30"],
        id="sydney-spring-0230-runs-once-right-after-the-jump",
    ),
    pytest.param(
        "Australia/Sydney",
        "0 * * * *",
        "2026-10-03T14:30",
        "2026-10-03T17:30",
        # 01:00 AEST, 03:00 AEDT, 04:00 AEDT
        ["2026-10-03T15:00", "2026-10-03T16:00", "2026-10-03T17:00"],
        id="sydney-spring-hourly-has-one-hour-fewer",
    ),
    # America/Santiago: 2026-04-04 24:00 -03 -> 23:00 -04; 2026-09-06 00:00 -04 -> 01:00 -03.
    pytest.param(
        "America/Santiago",
        "30 23 * * *",
        "2026-04-03T12:00",
        "2026-04-06T12:00",
        # 04-03 23:30 -03, 04-04 23:30 -03 (first reading only), 04-05 23:30 -04
        ["2026-04-04T02:30", "2026-04-05T02:30", "2026-04-06T03:30"],
        id="santiago-fall-2330-runs-once-at-first-reading",
    ),
    pytest.param(
        "America/Santiago",
        "0 0 * * *",
        "2026-04-04T12:00",
        "2026-04-06T12:00",
        # 04-05 00:00 -04, 04-06 00:00 -04
        ["2026-04-05T04:00", "2026-04-06T04:00"],
        id="santiago-fall-midnight-runs-once",
    ),
    pytest.param(
        "America/Santiago",
        "0 * * * *",
        "2026-04-05T01:30",
        "2026-04-05T04:30",
        # 23:00 -03, 23:00 -04, 00:00 -04
        ["2026-04-05T02:00", "2026-04-05T03:00", "2026-04-05T04:00"],
        id="santiago-fall-hourly-runs-the-repeated-hour-twice",
    ),
    pytest.param(
        "America/Santiago",
        "0 0 * * *",
        "2026-09-04T12:00",
        "2026-09-07T12:00",
        # 09-05 00:00 -04, 09-06 00:00 does not exist -> 01:00 -03, 09-07 00:00 -03
        ["2026-09-05T04:00", "2026-09-06T04:00", "2026-09-07T03:00"],
        id="santiago-spring-skipped-midnight-runs-once-right-after-the-jump",
    ),
    pytest.param(
        "America/Santiago",
        "0 * * * *",
        "2026-09-06T02:30",
        "2026-09-06T05:30",
        # 23:00 -04, (00:00 skipped), 01:00 -03, 02:00 -03
        ["2026-09-06T03:00", "2026-09-06T04:00", "2026-09-06T05:00"],
        id="santiago-spring-hourly-has-one-hour-fewer",
    ),
    # America/Havana: 2026-03-08 00:00 -05 -> 01:00 -04; 2026-11-01 01:00 -04 -> 00:00 -05.
    pytest.param(
        "America/Havana",
        "0 0 * * *",
        "2026-03-07T00:00",
        "2026-03-09T12:00",
        # 03-07 00:00 -05, 03-08 00:00 does not exist -> 01:00 -04, 03-09 00:00 -04
        ["2026-03-07T05:00", "2026-03-08T05:00", "2026-03-09T04:00"],
        id="havana-spring-skipped-midnight-runs-once-right-after-the-jump",
    ),
    pytest.param(
        "America/Havana",
        "0 0 * * *",
        "2026-10-31T12:00",
        "2026-11-02T12:00",
        # 11-01 00:00 -04 (first reading only), 11-02 00:00 -05
        ["2026-11-01T04:00", "2026-11-02T05:00"],
        id="havana-fall-repeated-midnight-runs-once-at-first-reading",
    ),
    # Australia/Lord_Howe shifts by 30 minutes:
    # 2026-04-05 02:00 +11 -> 01:30 +10:30; 2026-10-04 02:00 +10:30 -> 02:30 +11.
    pytest.param(
        "Australia/Lord_Howe",
        "45 1 * * *",
        "2026-04-04T00:00",
        "2026-04-05T20:00",
        # 04-05 01:45 +11 (first reading only), 04-06 01:45 +10:30
        ["2026-04-04T14:45", "2026-04-05T15:15"],
        id="lord-howe-fall-0145-runs-once-at-first-reading",
    ),
    pytest.param(
        "Australia/Lord_Howe",
        "*/15 * * * *",
        "2026-04-04T14:10",
        "2026-04-04T15:40",
        # 01:15, 01:30, 01:45 +11, then 01:30, 01:45, 02:00 +10:30: every real quarter hour
        [
            "2026-04-04T14:15",
            "2026-04-04T14:30",
            "2026-04-04T14:45",
            "2026-04-04T15:00",
            "2026-04-04T15:15",
            "2026-04-04T15:30",
        ],
        id="lord-howe-fall-quarter-hourly-runs-every-real-quarter-hour",
    ),
    pytest.param(
        "Australia/Lord_Howe",
        "0 * * * *",
        "2026-04-04T13:30",
        "2026-04-04T16:00",
        # 01:00 +11, 02:00 +10:30 (local hours are 90 real minutes apart here)
        ["2026-04-04T14:00", "2026-04-04T15:30"],
        id="lord-howe-fall-hourly-follows-the-local-hour",
    ),
    pytest.param(
        "Australia/Lord_Howe",
        "15 2 * * *",
        "2026-10-03T00:00",
        "2026-10-04T20:00",
        # 10-04 02:15 does not exist -> 02:30 +11; 10-05 02:15 +11
        ["2026-10-03T15:30", "2026-10-04T15:15"],
        id="lord-howe-spring-0215-runs-once-right-after-the-jump",
    ),
    pytest.param(
        "Australia/Lord_Howe",
        "*/30 * * * *",
        "2026-10-03T14:40",
        "2026-10-03T16:10",
        # 01:30 +10:30, (02:00 skipped), 02:30 +11, 03:00 +11
        ["2026-10-03T15:00", "2026-10-03T15:30", "2026-10-03T16:00"],
        id="lord-howe-spring-half-hourly-runs-every-real-half-hour",
    ),
    # Asia/Tokyo has no daylight-saving time: the control.
    pytest.param(
        "Asia/Tokyo",
        "30 2 * * *",
        "2026-03-28T00:00",
        "2026-03-30T00:00",
        ["2026-03-28T17:30", "2026-03-29T17:30"],
        id="tokyo-control-0230-on-the-european-spring-dates",
    ),
    pytest.param(
        "Asia/Tokyo",
        "0 * * * *",
        "2026-10-24T23:30",
        "2026-10-25T02:30",
        ["2026-10-25T00:00", "2026-10-25T01:00", "2026-10-25T02:00"],
        id="tokyo-control-hourly-on-the-european-fall-dates",
    ),
]


@pytest.mark.parametrize(("zone", "expr", "after", "until", "expected"), DST_CASES)
def test_daylight_saving_follows_vixie_cron(zone, expr, after, until, expected):
    assert occurrences(expr, zone, utc(after), utc(until)) == utcs(*expected)


@pytest.mark.parametrize(("zone", "expr", "after", "until", "expected"), DST_CASES)
def test_latest_occurrence_agrees_on_daylight_saving_days(zone, expr, after, until, expected):
    assert latest_occurrence(expr, zone, utc(after), utc(until)) == utc(expected[-1])


def test_fixed_time_in_repeated_hour_runs_once_where_plain_croniter_runs_twice():
    # croniter alone yields 02:30+02:00 and 02:30+01:00 on 2026-10-25.
    after = datetime(2026, 10, 24, 12, 0, tzinfo=ZoneInfo("Europe/Amsterdam"))
    fire_times = next_after("30 2 * * *", "Europe/Amsterdam", after, count=2)
    assert fire_times == utcs("2026-10-25T00:30", "2026-10-26T01:30")
    assert utc("2026-10-25T01:30") not in fire_times


def test_hour_list_covering_every_hour_is_fixed_and_runs_the_repeated_hour_once():
    # Only an hour field starting with "*" makes a wildcard-hour schedule (Vixie's rule).
    fire_times = occurrences(
        "0 0-23 * * *", "Europe/Amsterdam", utc("2026-10-24T23:30"), utc("2026-10-25T02:30")
    )
    # 02:00 CEST, 03:00 CET: the second 02:00 does not run
    assert fire_times == utcs("2026-10-25T00:00", "2026-10-25T02:00")


def test_stepped_minute_in_a_fixed_hour_is_wildcard_and_runs_the_repeated_hour_twice():
    # Debian cron: a minute field starting with "*" makes the job a wildcard one too.
    fire_times = occurrences(
        "*/30 2 * * *", "Europe/Amsterdam", utc("2026-10-24T23:00"), utc("2026-10-25T03:00")
    )
    assert fire_times == utcs(
        "2026-10-25T00:00", "2026-10-25T00:30", "2026-10-25T01:00", "2026-10-25T01:30"
    )


def test_stepped_minute_in_a_skipped_hour_has_nothing_to_run():
    fire_times = occurrences(
        "*/30 2 * * *", "Europe/Amsterdam", utc("2026-03-28T23:00"), utc("2026-03-29T03:00")
    )
    assert fire_times == []


def test_stepped_hour_is_wildcard_and_runs_in_both_readings():
    fire_times = occurrences(
        "0 */2 * * *", "Europe/Amsterdam", utc("2026-10-24T21:30"), utc("2026-10-25T02:30")
    )
    # 00:00 CEST, 02:00 CEST, 02:00 CET
    assert fire_times == utcs("2026-10-24T22:00", "2026-10-25T00:00", "2026-10-25T01:00")


def test_fire_time_whose_wall_clock_is_earlier_than_after_is_still_found():
    # after = 02:45 CEST, first reading; the next real half hour is 02:00 CET.
    fire_times = next_after("*/30 * * * *", "Europe/Amsterdam", utc("2026-10-25T00:45"), count=2)
    assert fire_times == utcs("2026-10-25T01:00", "2026-10-25T01:30")


def test_after_is_compared_as_a_real_instant_across_the_repeated_hour():
    # The 02:30 run already happened at its first reading; the second reading is no new run.
    fire_times = next_after("30 2 * * *", "Europe/Amsterdam", utc("2026-10-25T00:30"))
    assert fire_times == utcs("2026-10-26T01:30")


def test_after_equal_to_a_collapsed_jump_run_excludes_it():
    fire_times = next_after("0,30 2 * * *", "Europe/Amsterdam", utc("2026-03-29T01:00"))
    assert fire_times == utcs("2026-03-30T00:00")


def test_latest_occurrence_finds_a_first_reading_when_until_is_in_the_second():
    # until = 02:10 CET; the 02:45 run fired at 02:45 CEST, a wall time later than until's.
    latest = latest_occurrence(
        "45 2 * * *", "Europe/Amsterdam", utc("2026-10-24T12:00"), utc("2026-10-25T01:10")
    )
    assert latest == utc("2026-10-25T00:45")


# Day-of-month and day-of-week


def test_restricted_day_of_month_and_day_of_week_fire_on_either():
    fire_times = occurrences("0 0 13 * 5", "UTC", utc("2026-04-01T00:00"), utc("2026-04-30T00:00"))
    # Fridays 3, 10, 17, 24 April and Monday 13 April
    assert fire_times == utcs(
        "2026-04-03T00:00",
        "2026-04-10T00:00",
        "2026-04-13T00:00",
        "2026-04-17T00:00",
        "2026-04-24T00:00",
    )


def test_stepped_day_of_month_with_a_weekday_fires_on_days_matching_both():
    # A day field starting with "*" makes Vixie cron require both: odd-dated Saturdays only.
    fire_times = occurrences(
        "0 16 */2 * sat", "UTC", utc("2026-08-01T00:00"), utc("2026-08-31T00:00")
    )
    assert fire_times == utcs("2026-08-01T16:00", "2026-08-15T16:00", "2026-08-29T16:00")


def test_stepped_day_of_week_with_a_day_of_month_fires_on_days_matching_both():
    fire_times = occurrences(
        "0 0 13 * */5", "UTC", utc("2026-01-01T00:00"), utc("2026-12-31T00:00")
    )
    # */5 is Sunday and Friday: 13 February, March and November are Fridays, 13 September and
    # December Sundays.
    assert fire_times == utcs(
        "2026-02-13T00:00",
        "2026-03-13T00:00",
        "2026-09-13T00:00",
        "2026-11-13T00:00",
        "2026-12-13T00:00",
    )


def test_day_of_month_alone_restricts_when_day_of_week_is_star():
    fire_times = occurrences("0 0 13 * *", "UTC", utc("2026-04-01T00:00"), utc("2026-06-01T00:00"))
    assert fire_times == utcs("2026-04-13T00:00", "2026-05-13T00:00")


def test_day_of_week_alone_restricts_when_day_of_month_is_star():
    fire_times = occurrences("0 0 * * fri", "UTC", utc("2026-04-01T00:00"), utc("2026-04-15T00:00"))
    assert fire_times == utcs("2026-04-03T00:00", "2026-04-10T00:00")


def test_first_week_and_monday_is_not_first_monday():
    fire_times = occurrences("0 0 1-7 * 1", "UTC", utc("2026-06-01T00:00"), utc("2026-06-16T00:00"))
    # 2-7 June (the 1st is excluded by after) plus Mondays 8 and 15 June
    assert fire_times == utcs(*(f"2026-06-0{day}T00:00" for day in range(2, 9)), "2026-06-15T00:00")


def test_impossible_day_of_month_with_a_weekday_fires_on_the_weekday():
    fire_times = occurrences("0 0 31 2 1", "UTC", utc("2027-01-01T00:00"), utc("2027-03-01T00:00"))
    assert fire_times == utcs(
        "2027-02-01T00:00", "2027-02-08T00:00", "2027-02-15T00:00", "2027-02-22T00:00"
    )


def test_sunday_can_be_written_as_0_7_or_sun():
    after = utc("2026-05-12T00:00")
    sundays = [next_after(f"0 0 * * {day}", "UTC", after) for day in ("0", "7", "sun", "SUN")]
    assert sundays == [utcs("2026-05-17T00:00")] * 4


def test_29_february_fires_in_leap_years_even_across_2100():
    assert next_after("0 0 29 2 *", "UTC", utc("2026-01-01T00:00")) == utcs("2028-02-29T00:00")
    assert next_after("0 0 29 2 *", "UTC", utc("2097-01-01T00:00")) == utcs("2104-02-29T00:00")


# Expressions and aliases


@pytest.mark.parametrize(
    ("alias", "expanded"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@Daily", "0 0 * * *"),
    ],
)
def test_alias_normalizes_to_its_five_field_form(alias, expanded):
    assert validate_expression(alias) == expanded


def test_weekly_fires_on_sunday_at_midnight():
    assert next_after("@weekly", "UTC", utc("2026-05-12T10:00")) == utcs("2026-05-17T00:00")


def test_monthly_and_yearly_fire_on_the_first():
    after = utc("2026-05-12T10:00")
    assert next_after("@monthly", "UTC", after) == utcs("2026-06-01T00:00")
    assert next_after("@yearly", "UTC", after) == utcs("2027-01-01T00:00")


def test_hourly_runs_on_the_hour():
    assert next_after("@hourly", "UTC", utc("2026-05-12T10:00"), 2) == utcs(
        "2026-05-12T11:00", "2026-05-12T12:00"
    )


def test_expression_is_normalized_with_single_spaces_and_lower_case_names():
    assert validate_expression("  */15  9-17 * JAN-Mar  Mon-FRI ") == "*/15 9-17 * jan-mar mon-fri"


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "empty cron expression"),
        ("0 0 * * * *", "expected 5 fields"),
        ("0 0 0 * * * 2026", "seconds and years are not supported"),
        ("* * * *", "expected 5 fields"),
        ("@reboot", "'@reboot'"),
        ("@fortnightly", "unknown cron alias '@fortnightly'"),
        ("61 * * * *", "minute value 61 out of range (0-59)"),
        ("0 24 * * *", "hour value 24 out of range (0-23)"),
        ("0 0 0 * *", "day-of-month value 0 out of range (1-31)"),
        ("0 0 * 13 *", "month value 13 out of range (1-12)"),
        ("0 0 * * 8", "day-of-week value 8 out of range (0-7)"),
        ("every day", "expected 5 fields"),
        ("a b c d e", "minute value 'a' is not a number"),
        ("0 0 * foo *", "month value 'foo' is not a number or name"),
        ("*/0 * * * *", "minute step '0' is not a positive number"),
        ("50-10 * * * *", "minute range '50-10' wraps around; cron spells it '50-59,0-10'"),
        ("0 0 * * fri-mon", "cron spells it 'fri-7,mon'"),
        ("0 0 1 nov-mar *", "cron spells it '11,12,1-3'"),
        ("0 0 * * 5-1/2", "day-of-week range '5-1' goes backwards"),
        ("1,,2 * * * *", "empty item in minute field"),
        ("-5 * * * *", "minute range '-5' lacks a bound"),
        ("0 0 L * *", "day-of-month value 'L' is not a number"),
        ("0 0 * * 5#2", "day-of-week value '5#2' is not a number or name"),
        ("0 0 ? * *", "day-of-month value '?' is not a number"),
        ("H * * * *", "minute value 'H' is not a number"),
        ("R * * * *", "minute value 'R' is not a number"),
        ("0 0 31 2 *", "cron expression '0 0 31 2 *' never fires"),
        ("0 0 30 2 *", "cron expression '0 0 30 2 *' never fires"),
        ("0 0 31 4,6,9,11 *", "never fires: none of its months (4,6,9,11) has a day 31"),
    ],
)
def test_invalid_expression_is_rejected_naming_the_problem(expr, message):
    with pytest.raises(CronError, match=re.escape(message)):
        validate_expression(expr)


def test_out_of_range_message_reads_as_one_sentence():
    with pytest.raises(CronError) as caught:
        validate_expression("61 * * * *")
    assert str(caught.value) == (
        "invalid cron expression '61 * * * *': minute value 61 out of range (0-59)"
    )


@pytest.mark.parametrize(
    "bad_call",
    [
        lambda: validate_expression("61 * * * *"),
        lambda: validate_expression("0 0 * * *\n0 1 * * *"),
        lambda: validate_expression("0 0\n31 2 *"),
        lambda: validate_expression("@reboot"),
        lambda: validate_expression("x" * 500),
        lambda: validate_expression(None),
        lambda: validate_timezone("Mars/Base\nEarth/Moon"),
        lambda: validate_timezone(""),
        lambda: apply_catch_up([], "some\npolicy", utc("2026-01-01T00:00")),
    ],
    ids=[
        "out-of-range",
        "two-lines",
        "newline-in-dead-expression",
        "reboot",
        "very-long",
        "not-text",
        "timezone-with-newline",
        "empty-timezone",
        "policy-with-newline",
    ],
)
def test_every_error_is_one_line(bad_call):
    with pytest.raises(CronError) as caught:
        bad_call()
    assert "\n" not in str(caught.value)
    assert len(str(caught.value)) < 200


@pytest.mark.parametrize("expr", ["0 0 29 2 *", "59/15 * * * *", "0 9-17/2 * * 1-5", "* * * * *"])
def test_valid_expression_is_accepted(expr):
    assert validate_expression(expr) == expr


def test_start_and_step_runs_from_start_to_the_end_of_the_field():
    fire_times = next_after("50/5 * * * *", "UTC", utc("2026-05-12T10:00"), 3)
    assert fire_times == utcs("2026-05-12T10:50", "2026-05-12T10:55", "2026-05-12T11:50")


def test_a_star_inside_a_list_means_every_value_as_in_cron():
    # croniter refuses some such lists; cron reads the star as the whole field.
    assert validate_expression("*,40,30 * * * *") == "*,40,30 * * * *"
    fire_times = next_after("*,40,30 * * * *", "UTC", utc("2026-05-12T10:00"), 2)
    assert fire_times == utcs("2026-05-12T10:01", "2026-05-12T10:02")


THOUSANDS_OF_ONES = "1" * 5000
# Every way a number can stand in a field: as a step, a value, a bound, in a list.
UNREADABLE_STEPS = [f"*/{THOUSANDS_OF_ONES}", f"1/{THOUSANDS_OF_ONES}", "1-2/2147483648"]
UNREADABLE_VALUES = [THOUSANDS_OF_ONES, f"1-{THOUSANDS_OF_ONES}", f"{THOUSANDS_OF_ONES}-1"]


def _in_every_field(texts: list[str], message: str) -> list[Any]:
    """Each text in each of the five fields, alone and in a list, with the message it gets."""
    return [
        pytest.param(
            " ".join(item if index == position else "1" for index in range(5)),
            message,
            id=f"{('minute', 'hour', 'dom', 'month', 'dow')[position]}:{item[:12]}",
        )
        for position in range(5)
        for text in texts
        for item in (text, f"1,{text}")
    ]


@pytest.mark.parametrize(
    ("expr", "message"),
    _in_every_field(UNREADABLE_STEPS, "is too large: cron reads numbers up to 2147483647")
    + _in_every_field(UNREADABLE_VALUES, "out of range"),
)
def test_a_number_cron_cannot_read_is_refused_wherever_it_stands(expr, message):
    with pytest.raises(CronError) as caught:
        validate_expression(expr)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 300


def test_a_step_longer_than_its_field_fires_at_the_first_value_as_in_cron():
    assert validate_expression("*/2147483647 * * * *") == "*/2147483647 * * * *"
    fire_times = next_after("*/100 */2147483647 * * *", "UTC", utc("2026-05-12T10:00"), 2)
    assert fire_times == utcs("2026-05-13T00:00", "2026-05-14T00:00")


def test_a_step_of_thousands_of_digits_is_refused_not_read_as_the_first_value():
    with pytest.raises(CronError) as caught:
        validate_expression(f"*/{THOUSANDS_OF_ONES} * * * *")
    assert str(caught.value) == (
        f"invalid cron expression {f'*/{THOUSANDS_OF_ONES}'[:77] + '...'!r}: minute step "
        f"{THOUSANDS_OF_ONES[:77] + '...'!r} is too large: cron reads numbers up to 2147483647"
    )


# croniter expands the fields, but reads extensions cron does not have. Each is refused before
# croniter sees it, in one line naming the field.
CRONITER_ONLY = {
    "0 0 L * *": "day-of-month value 'L' is not a number; cron has no L, W, #, ?, H or R",
    "0 0 W15 * *": "day-of-month value 'W15' is not a number; cron has no",
    "0 0 15W * *": "day-of-month value '15W' is not a number; cron has no",
    "0 0 * * 5#3": "day-of-week value '5#3' is not a number or name; cron has no",
    "0 0 * * L5": "day-of-week value 'L5' is not a number or name; cron has no",
    "H * * * *": "minute value 'H' is not a number; cron has no",
    "H(0-29)/10 * * * *": "minute value 'H(0' is not a number; cron has no",
    "R * * * *": "minute value 'R' is not a number; cron has no",
    "0 0 ? * *": "day-of-month value '?' is not a number; cron has no",
    "0 0 * * fri-mon": "day-of-week range 'fri-mon' wraps around; cron spells it 'fri-7,mon'",
    "0 0 1 nov-mar *": "month range 'nov-mar' wraps around; cron spells it '11,12,1-3'",
    "0 0 * * 5-1/2": "day-of-week range '5-1' goes backwards",
    "0 0 * * mon-sun": "day-of-week range 'mon-sun' wraps around; cron spells it 'mon-7'",
    "0 */5 * * * *": "got 6; seconds and years are not supported",
    "0 0 12 * * * 2030": "got 7; seconds and years are not supported",
}


@pytest.mark.parametrize(("expr", "message"), CRONITER_ONLY.items(), ids=CRONITER_ONLY.keys())
def test_what_croniter_reads_and_cron_does_not_is_refused_in_one_line(expr, message):
    croniter = pytest.importorskip("croniter").croniter
    assert croniter.is_valid(expr, hash_id="some-schedule")
    with pytest.raises(CronError) as caught:
        validate_expression(expr)
    assert str(caught.value).startswith(f"invalid cron expression {expr!r}: ")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_field_croniter_refuses_after_the_gate_is_still_one_line_naming_the_field(monkeypatch):
    from cronjob.cron import fields

    croniter = pytest.importorskip("croniter")
    expand = croniter.croniter.expand

    def refuse_day_of_week(expression, *args, **kwargs):
        if expression.split()[4] != "*":
            raise croniter.CroniterBadCronError(f"[{expression}] is not acceptable\ndetails")
        return expand(expression, *args, **kwargs)

    monkeypatch.setattr(croniter.croniter, "expand", refuse_day_of_week)
    # Both caches: the expression and its fields must be read afresh.
    fields.compile_expression.cache_clear()
    fields.field_values.cache_clear()
    with pytest.raises(CronError) as caught:
        validate_expression("0 0 * * 1-5")
    assert str(caught.value) == (
        "invalid cron expression '0 0 * * 1-5': day-of-week field '1-5' is not valid"
    )


# Timezones


@pytest.mark.parametrize(
    "name", ["UTC", "Europe/Amsterdam", "America/Argentina/Buenos_Aires", "Etc/GMT+5"]
)
def test_known_timezone_is_accepted(name):
    assert validate_timezone(name) == name


def test_timezone_name_is_stripped():
    assert validate_timezone(" Asia/Tokyo ") == "Asia/Tokyo"


@pytest.mark.parametrize(
    "name",
    [
        "Mars/Base",
        "utc",
        "America",
        "../../etc/passwd",
        "/etc/localtime",
        "localtime",
        "posixrules",
        "right/UTC",
        "zone.tab",
        "Europe/Amsterdam\x00",
    ],
)
def test_unknown_timezone_is_rejected(name):
    with pytest.raises(CronError, match=r"^unknown timezone "):
        validate_timezone(name)


def test_unknown_timezone_message_names_it():
    with pytest.raises(CronError) as caught:
        validate_timezone("Mars/Base")
    assert str(caught.value) == "unknown timezone 'Mars/Base'"


def test_occurrences_reject_an_unknown_timezone():
    with pytest.raises(CronError, match="unknown timezone 'Mars/Base'"):
        occurrences("* * * * *", "Mars/Base", utc("2026-01-01T00:00"), utc("2026-01-02T00:00"))


# Boundaries of occurrences


def test_occurrence_equal_to_after_is_excluded_and_equal_to_until_included():
    fire_times = occurrences("0 * * * *", "UTC", utc("2026-05-12T10:00"), utc("2026-05-12T12:00"))
    assert fire_times == utcs("2026-05-12T11:00", "2026-05-12T12:00")


def test_limit_keeps_the_first_occurrences():
    fire_times = occurrences(
        "* * * * *", "UTC", utc("2026-05-12T10:00"), utc("2026-05-13T10:00"), limit=3
    )
    assert fire_times == utcs("2026-05-12T10:01", "2026-05-12T10:02", "2026-05-12T10:03")


def test_limit_zero_returns_nothing():
    assert (
        occurrences("* * * * *", "UTC", utc("2026-05-12T10:00"), utc("2026-05-13T10:00"), 0) == []
    )


def test_empty_window_returns_nothing():
    moment = utc("2026-05-12T10:00")
    assert occurrences("* * * * *", "UTC", moment, moment) == []
    assert occurrences("* * * * *", "UTC", moment, moment - timedelta(hours=1)) == []


def test_window_between_fire_times_returns_nothing():
    assert occurrences("0 3 * * *", "UTC", utc("2026-05-12T04:00"), utc("2026-05-12T05:00")) == []


def test_seconds_in_the_window_bounds_are_respected():
    fire_times = occurrences(
        "* * * * *", "UTC", utc("2026-05-12T10:00:30"), utc("2026-05-12T10:02:59")
    )
    assert fire_times == utcs("2026-05-12T10:01", "2026-05-12T10:02")


def test_results_are_utc_whatever_the_zone_of_the_arguments():
    amsterdam = ZoneInfo("Europe/Amsterdam")
    fire_times = occurrences(
        "0 9 * * *",
        "America/New_York",
        datetime(2026, 5, 12, 0, 0, tzinfo=amsterdam),
        datetime(2026, 5, 13, 0, 0, tzinfo=timezone(timedelta(hours=-7))),
    )
    assert fire_times == utcs("2026-05-12T13:00")
    assert fire_times[0].tzinfo is UTC


def test_naive_datetimes_are_refused():
    with pytest.raises(ValueError, match="timezone-aware"):
        occurrences("* * * * *", "UTC", datetime(2026, 5, 12), utc("2026-05-13T00:00"))
    with pytest.raises(ValueError, match="timezone-aware"):
        next_after("* * * * *", "UTC", datetime(2026, 5, 12))


def test_next_after_is_the_start_of_occurrences():
    for zone, expr, after, _, _ in (case.values for case in DST_CASES):
        far = utc(after) + timedelta(days=10)
        assert next_after(expr, zone, utc(after), 5) == occurrences(
            expr, zone, utc(after), far, limit=5
        )


# latest_occurrence(s) against occurrences


def test_latest_occurrence_is_none_when_nothing_fires_in_the_window():
    assert (
        latest_occurrence("0 3 * * *", "UTC", utc("2026-05-12T04:00"), utc("2026-05-12T05:00"))
        is None
    )


def test_latest_occurrence_of_a_month_of_minutely_runs_is_the_last_minute():
    latest = latest_occurrence(
        "* * * * *", "Europe/Amsterdam", utc("2026-04-12T10:00"), utc("2026-05-12T10:00:30")
    )
    assert latest == utc("2026-05-12T10:00")


def test_latest_occurrences_are_the_tail_of_occurrences_in_ascending_order():
    after, until = utc("2026-10-24T20:00"), utc("2026-10-25T04:00")
    every = occurrences("*/20 * * * *", "Europe/Amsterdam", after, until)
    assert latest_occurrences("*/20 * * * *", "Europe/Amsterdam", after, until, 7) == every[-7:]
    assert latest_occurrences("*/20 * * * *", "Europe/Amsterdam", after, until, 500) == every


_AGREEMENT_EXPRESSIONS = [
    "*/20 * * * *",
    "0 * * * *",
    "30 2 * * *",
    "0,30 1-3 * * *",
    "0 0 * * *",
    "45 1 * * *",
    "15 23,0 * * *",
    "0 0 13 * 5",
]
_AGREEMENT_ZONES = sorted({zone for zone, _, _, _ in TRANSITIONS} | {"Asia/Tokyo", "UTC"})


def test_latest_occurrence_agrees_with_occurrences_around_every_transition():
    generator = random.Random(20260329)
    for _ in range(80):
        zone, instant, _, _ = generator.choice(TRANSITIONS)
        expr = generator.choice(_AGREEMENT_EXPRESSIONS)
        after = utc(instant) + timedelta(minutes=generator.randrange(-30 * 60, 6 * 60))
        until = after + timedelta(minutes=generator.randrange(1, 30 * 60))
        every = occurrences(expr, zone, after, until)
        latest = latest_occurrence(expr, zone, after, until)
        assert latest == (every[-1] if every else None), (zone, expr, after, until)


def test_occurrences_are_strictly_ascending_around_every_transition():
    for zone, instant, _, _ in TRANSITIONS:
        for expr in [*_AGREEMENT_EXPRESSIONS, "*/15 * * * *", "* 2 * * *"]:
            fire_times = occurrences(
                expr, zone, utc(instant) - timedelta(hours=2), utc(instant) + timedelta(hours=2)
            )
            assert all(a < b for a, b in pairwise(fire_times)), (zone, expr)


def test_windows_split_anywhere_add_up_to_the_whole():
    # The materializer advances its high-water mark tick by tick; no run may be lost or doubled.
    zone, expr = "Europe/Amsterdam", "*/20 * * * *"
    start, end = utc("2026-10-24T22:00"), utc("2026-10-25T03:00")
    whole = occurrences(expr, zone, start, end)
    stitched: list[datetime] = []
    mark = start
    while mark < end:
        tick = min(mark + timedelta(minutes=7), end)
        stitched += occurrences(expr, zone, mark, tick)
        mark = tick
    assert stitched == whole


# Catch-up policies

DUE = utcs("2026-05-12T09:57", "2026-05-12T09:58", "2026-05-12T09:59", "2026-05-12T10:00")
NOW = utc("2026-05-12T10:00:40")


def test_catch_up_latest_runs_only_the_newest_missed_occurrence():
    assert apply_catch_up(DUE, "latest", NOW) == utcs("2026-05-12T10:00")


def test_catch_up_all_runs_every_missed_occurrence():
    assert apply_catch_up(DUE, "all", NOW) == DUE


def test_catch_up_all_is_bounded_to_the_newest():
    assert apply_catch_up(DUE, "all", NOW, bound=2) == utcs("2026-05-12T09:59", "2026-05-12T10:00")


def test_catch_up_none_runs_the_current_occurrence_only():
    assert apply_catch_up(DUE, "none", NOW) == utcs("2026-05-12T10:00")


def test_catch_up_none_skips_an_occurrence_older_than_the_grace_period():
    later = utc("2026-05-12T10:05")
    assert apply_catch_up(DUE, "none", later) == []
    assert apply_catch_up(DUE, "none", later, grace_seconds=600) == utcs("2026-05-12T10:00")


@pytest.mark.parametrize("policy", ["latest", "all", "none"])
def test_catch_up_with_nothing_due_runs_nothing(policy):
    assert apply_catch_up([], policy, NOW) == []


def test_unknown_catch_up_policy_is_rejected():
    with pytest.raises(CronError, match="unknown catch-up policy 'some'"):
        apply_catch_up(DUE, "some", NOW)


# An independent model: walk real time minute by minute, read the wall clock, apply Vixie's
# rules directly. Schedules restrict minute and hour only, given as sets; a minute or hour field
# starting with "*" makes a wildcard schedule.

_SIMULATED = [
    ("*/20 * * * *", range(0, 60, 20), None),
    ("0 * * * *", {0}, None),
    ("* 2 * * *", range(60), {2}),
    ("30 2 * * *", {30}, {2}),
    ("0,30 1-3 * * *", {0, 30}, {1, 2, 3}),
    ("0 0 * * *", {0}, {0}),
    ("15 23,0 * * *", {15}, {23, 0}),
    ("45 1 * * *", {45}, {1}),
]


def _simulate_vixie(zone, minutes, hours, wildcard, after, until, lead=timedelta(hours=1)):
    # `lead` must cover the longest repeated period, so first readings before `after` are seen.
    tz = ZoneInfo(zone)

    def matches(wall):
        return wall.minute in minutes and (hours is None or wall.hour in hours)

    fired, fixed_done = [], set()
    moment = after - lead
    previous_wall = moment.astimezone(tz).replace(tzinfo=None)
    while moment < until:
        moment += timedelta(minutes=1)
        wall = moment.astimezone(tz).replace(tzinfo=None)
        if wildcard:
            # wildcard: every real minute whose wall clock matches
            if matches(wall):
                fired.append(moment)
        else:
            skipped = []
            step = previous_wall + timedelta(minutes=1)
            while step < wall:
                skipped.append(step)
                step += timedelta(minutes=1)
            # fixed time: each matching wall time once; skipped ones right after the jump
            due = [w for w in [*skipped, wall] if matches(w) and w not in fixed_done]
            if due:
                fired.append(moment)
                fixed_done.update(due)
        previous_wall = wall
    return [moment for moment in fired if after < moment <= until]


@pytest.mark.parametrize(
    ("zone", "instant"),
    [(zone, instant) for zone, instant, _, _ in TRANSITIONS],
    ids=[f"{zone}-{instant[:10]}" for zone, instant, _, _ in TRANSITIONS],
)
def test_matches_a_minute_by_minute_simulation_of_vixie_cron(zone, instant):
    after, until = utc(instant) - timedelta(hours=2), utc(instant) + timedelta(hours=2)
    for expr, minutes, hours in _SIMULATED:
        wildcard = expr.split()[0].startswith("*") or expr.split()[1].startswith("*")
        expected = _simulate_vixie(zone, set(minutes), hours, wildcard, after, until)
        assert occurrences(expr, zone, after, until) == expected, expr


# The wall-clock walk against croniter: every accepted expression expands to sets of field
# values that `cronjob.cron` walks itself; croniter, walking the same expression, is the
# reference. Random expressions over every field form, starts, zones and directions, seeded.

_FIELD_BOUNDS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_WEEKDAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


def _random_value(rng, index, low, high):
    value = rng.randint(low, high)
    if index == 3 and rng.random() < 0.2:
        return _MONTHS[value - 1]
    if index == 4 and value < 7 and rng.random() < 0.2:
        return _WEEKDAYS[value]
    return str(value)


def _random_item(rng, index):
    low, high = _FIELD_BOUNDS[index]
    first, last = sorted((rng.randint(low, high), rng.randint(low, high)))
    return rng.choice(
        [
            _random_value(rng, index, low, high),
            _random_value(rng, index, low, high),
            f"{first}-{last}",
            f"*/{rng.randint(1, high - low + 2)}",
            f"{first}-{last}/{rng.randint(1, 10)}",
            f"{first}/{rng.randint(1, 15)}",
        ]
    )


def _random_expression(rng):
    from cronjob.cron import fields

    while True:
        values = [
            "*" if rng.random() < 0.4 else ",".join(_random_item(rng, i) for _ in range(3))
            for i in range(5)
        ]
        if rng.random() < 0.2:
            values[2], values[3] = rng.choice(["29", "30", "31", "30,31"]), "2"
        try:
            return fields.compile_expression(" ".join(values))
        except CronError:
            continue  # dead or out of range: not a schedule to compare


def test_walking_the_expanded_fields_finds_the_wall_times_croniter_finds():
    from cronjob.cron import fields, walk

    rng = random.Random(20260512)
    for _ in range(400):
        cron = _random_expression(rng)
        start = datetime(1990, 1, 1) + timedelta(minutes=rng.randrange(160 * 525_960))
        forward = rng.random() < 0.5
        count = rng.randint(1, 12)
        walked = list(islice(walk.walls(cron, start, forward), count))
        reference = list(islice(fields.croniter_walls(cron, start, forward), count))
        assert walked == reference, (cron.expression, start, forward)


def test_walking_hands_over_to_croniter_near_the_ends_of_the_calendar():
    from cronjob.cron import fields, walk

    for expression, start, forward in [
        ("0 0 29 2 *", datetime(9970, 1, 1), True),
        ("*/20 3 * * 1", datetime(9987, 12, 30), True),
        ("0 0 29 2 *", datetime(40, 1, 1), False),
        ("*/20 3 * * 1", datetime(12, 1, 3), False),
    ]:
        cron = fields.compile_expression(expression)
        walked = list(walk.walls(cron, start, forward))
        reference = list(fields.croniter_walls(cron, start, forward))
        assert walked == reference
        assert walked  # the stream runs until croniter's calendar ends, then stops


def test_occurrences_in_every_zone_match_a_walk_by_croniter(monkeypatch):
    from cronjob.cron import fields, walk

    rng = random.Random(7)
    zones = sorted({zone for zone, _, _, _ in TRANSITIONS} | {"UTC", "Asia/Kolkata"})
    cases = []
    for _ in range(150):
        cron = _random_expression(rng)
        zone = rng.choice(zones)
        # Around a transition in half of the cases, where the daylight-saving rules apply.
        if rng.random() < 0.5:
            center = utc(
                rng.choice([i for z, i, _, _ in TRANSITIONS if z == zone] or ["2026-06-01"])
            )
        else:
            center = utc("2026-01-01T00:00") + timedelta(minutes=rng.randrange(525_600))
        after = center - timedelta(seconds=rng.randrange(3 * 86_400))
        until = after + timedelta(seconds=rng.randrange(1, 6 * 86_400))
        cases.append((cron.expression, zone, after, until))
    walked = [
        (occurrences(e, z, a, u, limit=30), latest_occurrences(e, z, a, u, 5))
        for e, z, a, u in cases
    ]
    monkeypatch.setattr(walk, "walls", fields.croniter_walls)
    reference = [
        (occurrences(e, z, a, u, limit=30), latest_occurrences(e, z, a, u, 5))
        for e, z, a, u in cases
    ]
    assert walked == reference
