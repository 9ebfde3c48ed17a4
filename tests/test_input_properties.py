"""Every parser of user input, on any input: a value or BadInput, never anything else.

Through the command line: a value, or one line on stderr with exit 2, never a traceback and
never a write. Each parser is also fed a long input built from what it was given, so that
work growing faster than the input (a quadratic scan, int() of thousands of digits) shows.
Examples are derived deterministically, so every run of the suite tries the same ones.
"""

from __future__ import annotations

import contextlib
import string
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronjob.errors import BadInput, JobrunnerError
from tests.conftest import count, run_cli

FAST = settings(max_examples=60, derandomize=True, deadline=None, database=None)
CLI = settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Text that stresses parsers: digits of several scripts, separators, signs, units, quotes,
# brackets, whitespace of several kinds, NUL, a lone surrogate and an astral character.
TRICKY = "0123456789_-+.:,/*@ TZtzsmhd\u00e9\u0663\uff11\u00b2\t\n\x00\ud800\U0001f600[]{}\"'\\=%?#"
tricky_text = st.text(alphabet=TRICKY, max_size=40)
any_text = st.one_of(tricky_text, st.text(max_size=40))

# Long enough that quadratic work would take minutes, short enough that linear work is instant.
LONG_INPUT = 200_000
LINEAR_BUDGET = 5.0  # seconds: generous for a loaded machine, far below quadratic time


def _value_or_bad_input(parse: Callable[[], Any]) -> Any:
    try:
        return parse()
    except BadInput as exc:
        message = str(exc)
        assert "\n" not in message
        assert len(message) < 600, message
        return exc


def _linear(parse: Callable[[str], Any], text: str) -> None:
    long_text = (text or "x") * (LONG_INPUT // max(1, len(text)) + 1)
    started = time.monotonic()
    _value_or_bad_input(lambda: parse(long_text))
    assert time.monotonic() - started < LINEAR_BUDGET


# -- the parsers, directly -------------------------------------------------------------------


@FAST
@given(any_text)
def test_durations(text):
    from cronjob.inputs import parse_duration

    value = _value_or_bad_input(lambda: parse_duration(text))
    if not isinstance(value, BadInput):
        assert 0 <= value <= 10 * 365 * 86400
    _linear(parse_duration, text)


@FAST
@given(st.one_of(any_text, st.integers(), st.integers(min_value=10**100)))
def test_ids_and_counts(value):
    from cronjob.inputs import parse_count, parse_id

    for parse in (parse_id, lambda v: parse_count(v, what="count")):
        number = _value_or_bad_input(lambda p=parse: p(value))
        if not isinstance(number, BadInput):
            assert isinstance(number, int)
            if isinstance(value, str):
                digits = value.strip().lstrip("-")
                assert digits.isascii() and digits.isdigit(), value
                assert number == int(value)
    if isinstance(value, str):
        _linear(parse_id, value)


@FAST
@given(st.one_of(any_text, st.datetimes().map(datetime.isoformat)))
def test_timestamps(text):
    from cronjob.inputs import EARLIEST, LATEST, parse_timestamp

    value = _value_or_bad_input(lambda: parse_timestamp(text))
    if not isinstance(value, BadInput):
        assert value.tzinfo is not None and EARLIEST <= value <= LATEST
    _linear(parse_timestamp, text)


CRON_TOKEN = st.one_of(
    st.sampled_from(["*", "*/5", "1-5", "mon-fri", "jan", "0", "59", "7", "L", "?", "1,2"]),
    st.from_regex(r"[0-9*]{1,6}([-/,][0-9a-z]{1,6}){0,3}", fullmatch=True),
    tricky_text,
)
cron_text = st.one_of(
    st.lists(CRON_TOKEN, min_size=1, max_size=7).map(" ".join),
    st.sampled_from(["@daily", "@reboot", "@HOURLY", "@nope"]),
    any_text,
)


@FAST
@given(cron_text)
def test_cron_expressions(text):
    from cronjob import cron

    try:
        normalized = cron.validate_expression(text)
    except cron.CronError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 600
    else:
        assert cron.validate_expression(normalized) == normalized
    started = time.monotonic()
    with contextlib.suppress(cron.CronError):
        cron.validate_expression(" ".join([text or "1"] * 5) * (LONG_INPUT // 100))
    assert time.monotonic() - started < LINEAR_BUDGET


@FAST
@given(st.one_of(any_text, st.sampled_from(["Europe/Amsterdam", "UTC", "../etc/passwd"])))
def test_timezones(text):
    from cronjob import cron

    try:
        assert cron.validate_timezone(text) == text.strip()
    except cron.CronError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 600


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@FAST
@given(st.one_of(any_text, json_values.map(repr), st.builds(lambda n: "[" * n, st.integers(0, 99))))
def test_json_payloads(text):
    from cronjob.inputs import parse_payload

    _value_or_bad_input(lambda: parse_payload(text))
    _linear(parse_payload, text)


@FAST
@given(json_values)
def test_decoded_payloads_through_the_python_api(value):
    from cronjob.api import new_run

    _value_or_bad_input(lambda: new_run("t", value))


TOML_LINE = st.one_of(
    st.sampled_from(
        [
            "[schedules.a]",
            "[schedules.b]",
            'cron = "* * * * *"',
            'type = "t"',
            "priority = 1",
            'timezone = "Mars/Olympus"',
            "max_attempts = 0",
            "payload = { a = 1 }",
            "enabled = 1",
            'catch_up = "all"',
            "catch_up_limit = 99999",
            "[other]",
            "schedules = 1",
            "x = [[[[",
        ]
    ),
    tricky_text,
)


@FAST
@given(st.lists(TOML_LINE, max_size=8).map("\n".join))
def test_schedule_files(text):
    from cronjob.definitions import load_file

    _value_or_bad_input(lambda: load_file(text, source="f.toml"))
    _linear(lambda t: load_file(t, source="f.toml"), text)


@FAST
@given(any_text)
def test_status_filters(text):
    from cronjob.inputs import parse_statuses
    from cronjob.prune import PRUNABLE

    def prune_statuses(value: str) -> tuple[str, ...]:
        return parse_statuses(value, allowed=PRUNABLE, command="prune")

    _value_or_bad_input(lambda: prune_statuses(text))
    _linear(prune_statuses, text)


URL_TEXT = st.text(alphabet="abcxyz019 =:'\"\\@?&%/é\x00", max_size=30)


@pytest.mark.usefixtures("no_server_reachable")
@CLI
@given(text=URL_TEXT)
def test_database_urls_connect_or_fail_with_one_line(text):
    from cronjob import db

    try:
        conn = db.connect(text, attempts=1)
    except JobrunnerError as exc:
        assert "\n" not in str(exc)
    else:
        conn.close()


@pytest.fixture
def no_server_reachable(monkeypatch):
    """Aim every URL without a host at a directory where no server listens: no test here
    reaches a real server or a name server."""
    monkeypatch.setenv("PGHOST", "/nonexistent-jobrunner-socket-dir")
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "1")
    monkeypatch.delenv("PGPORT", raising=False)


# -- the same, through the command line --------------------------------------------------------


def _one_line_or_success(result, conn, runs_before: int) -> None:
    assert "Traceback" not in result.stderr
    if result.exit_code == 0:
        return
    assert result.exit_code == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stdout == ""
    assert count(conn, "SELECT count(*) FROM job_runs") == runs_before


CLI_TEXT = st.text(alphabet=TRICKY.replace("\x00", "").replace("\ud800", ""), max_size=30)
ENQUEUE_OPTION = st.sampled_from(
    [
        "--run-at",
        "--delay",
        "--max-attempts",
        "--priority",
        "--payload",
        "--idempotency-key",
        "--tenant",
    ]
)


@CLI
@given(option=ENQUEUE_OPTION, value=CLI_TEXT)
def test_enqueue_options_through_the_command_line(db_url, conn, option, value):
    before = count(conn, "SELECT count(*) FROM job_runs")
    result = run_cli("enqueue", "t", f"{option}={value}", "--database-url", db_url)
    _one_line_or_success(result, conn, before)


@CLI
@given(st.lists(st.one_of(CLI_TEXT, json_values.map(repr)), min_size=1, max_size=4))
def test_jsonl_lines_through_the_command_line(db_url, conn, lines):
    before = count(conn, "SELECT count(*) FROM job_runs")
    text = "\n".join(lines) + "\n"
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input=text)
    _one_line_or_success(result, conn, before)


@CLI
@given(
    command=st.sampled_from(
        [
            ["cancel"],
            ["retry"],
            ["show"],
            ["list", "--limit"],
            ["list", "--status"],
            ["list", "--type"],
            ["check", "--max-dead"],
            ["check", "--max-queue-age"],
            ["prune", "--older-than"],
            ["prune", "--older-than", "1d", "--status"],
        ]
    ),
    value=CLI_TEXT,
)
def test_ids_counts_filters_and_durations_through_the_command_line(db_url, conn, command, value):
    before = count(conn, "SELECT count(*) FROM job_runs")
    result = run_cli(*command, value, "--database-url", db_url)
    assert "Traceback" not in result.stderr
    # 1: an id that names no run, or a check that found a breach.
    assert result.exit_code in (0, 1, 2), result.stderr
    if result.exit_code == 2:
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert count(conn, "SELECT count(*) FROM job_runs") == before


@CLI
@given(
    expr=cron_text.filter(lambda t: "\x00" not in t and "\ud800" not in t),
    zone=CLI_TEXT,
    start=CLI_TEXT,
)
def test_schedule_preview_through_the_command_line(expr, zone, start):
    result = run_cli(
        "schedule",
        "preview",
        expr,
        "--timezone",
        zone or "UTC",
        "--from",
        start or "2026-01-01",
        "--count",
        "3",
    )
    assert "Traceback" not in result.stderr
    assert result.exit_code in (0, 2), result.stderr
    if result.exit_code == 2:
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@CLI
@given(st.lists(TOML_LINE.filter(lambda t: "\x00" not in t and "\ud800" not in t), max_size=8))
def test_schedule_files_through_the_command_line(db_url, conn, lines):
    before = count(conn, "SELECT count(*) FROM job_definitions")
    text = "\n".join(lines) + "\n"
    result = run_cli("schedule", "sync", "-", "--dry-run", "--database-url", db_url, input=text)
    assert "Traceback" not in result.stderr
    assert result.exit_code in (0, 2), result.stderr
    if result.exit_code == 2:
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert count(conn, "SELECT count(*) FROM job_definitions") == before


def test_the_tricky_alphabet_holds_what_python_alone_reads_as_numbers():
    # int() reads these; jobrunner does not.
    assert int("1_0") == 10 and int("\u0663") == 3 and int("\uff11") == 1
    assert set("_\u0663\uff11") <= set(TRICKY)
    assert string.digits in TRICKY
