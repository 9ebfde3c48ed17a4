"""Every option of a run, declared once (cronjob.run_options), is taken alike at every door."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from cronjob.api import enqueue, new_run
from cronjob.errors import BadInput
from cronjob.run_options import RUN_OPTIONS
from tests.conftest import run_cli

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
# A value of each option, as Python gives it, as a command line or a JSON line writes it,
# and as its column holds it.
SAMPLES: dict[str, tuple[Any, str, Any]] = {
    "run_at": (
        datetime(2031, 2, 3, 4, 5, tzinfo=UTC),
        "2031-02-03T04:05:00+00:00",
        datetime(2031, 2, 3, 4, 5, tzinfo=UTC),
    ),
    "idempotency_key": ("key-1", "key-1", "key-1"),
    "unique_key": ("user:7", "user:7", "user:7"),
    "max_attempts": (7, "7", 7),
    "priority": (-3, "-3", -3),
    "tenant_id": ("acme", "acme", "acme"),
    "queue": ("emails", "emails", "emails"),
    "result_id": (
        uuid.UUID("5b0ec9e4-54b1-4c3e-9a57-6c1b2f2a8d10"),
        "5b0ec9e4-54b1-4c3e-9a57-6c1b2f2a8d10",
        uuid.UUID("5b0ec9e4-54b1-4c3e-9a57-6c1b2f2a8d10"),
    ),
    "run_after": (
        datetime(2031, 2, 3, 4, 5, tzinfo=UTC),
        "2031-02-03T04:05:00+00:00",
        datetime(2031, 2, 3, 4, 5, tzinfo=UTC),
    ),
    "traceparent": (TRACEPARENT, TRACEPARENT, TRACEPARENT),
    "tracestate": ("vendor=abc,other=1", "vendor=abc,other=1", "vendor=abc,other=1"),
    "batch_id": (42, "42", 42),
}
STORED = sorted(name for name, option in RUN_OPTIONS.items() if option.column)


def test_every_stored_option_has_a_sample_here():
    assert sorted(SAMPLES) == STORED


def _column(conn: Any, run_id: int, name: str) -> Any:
    column = RUN_OPTIONS[name].column
    return conn.execute(f"SELECT {column} FROM job_runs WHERE id = %s", [run_id]).fetchone()[0]


@pytest.mark.parametrize("name", STORED)
def test_an_option_given_to_enqueue_is_stored_in_its_column(conn, name):
    value, _text, stored = SAMPLES[name]
    run_id = enqueue(conn, "t", {}, **{name: value})
    assert _column(conn, run_id, name) == stored


@pytest.mark.parametrize("name", [name for name in STORED if RUN_OPTIONS[name].flag])
def test_an_option_given_on_the_command_line_is_stored_in_its_column(db_url, conn, name):
    _value, text, stored = SAMPLES[name]
    result = run_cli("enqueue", "t", RUN_OPTIONS[name].flag, text, "--database-url", db_url)
    assert result.exit_code == 0, result.stderr
    assert _column(conn, int(result.stdout), name) == stored


@pytest.mark.parametrize("name", [name for name in STORED if RUN_OPTIONS[name].key])
def test_an_option_given_in_a_jsonl_line_is_stored_in_its_column(db_url, conn, name):
    _value, text, stored = SAMPLES[name]
    line = json.dumps({"type": "t", RUN_OPTIONS[name].key: text})
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input=line + "\n")
    assert result.exit_code == 0, result.stderr
    assert _column(conn, int(result.stdout), name) == stored


def test_the_command_line_and_jsonl_take_every_option_but_the_frameworks_own():
    help_text = run_cli("enqueue", "--help").stdout
    for name, option in RUN_OPTIONS.items():
        # A Django task's, set by the backend alone; the trace context, taken from the
        # caller's OpenTelemetry context or the TRACEPARENT and TRACESTATE variables; the
        # batch, set by enqueue_batch (`enqueue --jsonl --then` on the command line).
        if name in ("queue", "result_id", "run_after", "traceparent", "tracestate", "batch_id"):
            assert option.flag is None and option.key is None
            continue
        assert option.flag in help_text
        assert option.key in help_text


def test_a_bad_option_is_named_by_each_door_as_that_door_calls_it(db_url):
    with pytest.raises(BadInput, match="invalid priority 'high'"):
        new_run("t", priority="high")
    result = run_cli("enqueue", "t", "--priority", "high", "--database-url", db_url)
    assert (result.exit_code, "invalid --priority 'high'" in result.stderr) == (2, True)
    line = json.dumps({"type": "t", "priority": "high"}) + "\n"
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input=line)
    assert (result.exit_code, "line 1: invalid priority 'high'" in result.stderr) == (2, True)


def test_an_unknown_keyword_is_a_type_error_as_for_any_python_function(conn):
    with pytest.raises(TypeError, match="unexpected keyword argument 'tenant'"):
        enqueue(conn, "t", {}, tenant="acme")  # type: ignore[call-arg]


def test_an_option_given_as_none_is_left_unset(conn):
    run_id = enqueue(conn, "t", {}, priority=None, tenant_id=None)
    assert (_column(conn, run_id, "priority"), _column(conn, run_id, "tenant_id")) == (0, None)
