"""Nothing a handler logs can fail a finalize, run an innocent run twice, or break a line of
jobrunner's stderr: values are redacted and made storable before they are encoded, and a
run log that still cannot be stored is dropped for its run alone."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import jobrunner_process
from tests.factories import insert_run, insert_runs
from tests.handlers.hostile import HUGE, SECRETS

HANDLERS = "tests.handlers.hostile"


def _tick(db_url: str, exec_log: Path) -> str:
    """One `jobrunner tick --batch-size 10` process; returns its stderr, checked to be UTF-8."""
    process = jobrunner_process(
        "tick",
        "--database-url",
        db_url,
        "--handlers",
        HANDLERS,
        "--batch-size",
        "10",
        env={"JOBRUNNER_TEST_EXEC_LOG": str(exec_log)},
        encoding="utf-8",
        errors="strict",  # no lone surrogate, no stray byte
    )
    _out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-3000:]
    return err


def _refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is no JSON")


def _no_surrogates(value: Any) -> None:
    if isinstance(value, str):
        value.encode("utf-8")  # raises on a lone surrogate an escape decoded to
    elif isinstance(value, dict):
        for key, item in value.items():
            _no_surrogates(key)
            _no_surrogates(item)
    elif isinstance(value, list):
        for item in value:
            _no_surrogates(item)


def _json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every line of `stderr` as the one JSON object it must be (RFC 8259: no NaN)."""
    # Split on "\n" only: U+2028 in a value is written as is, and splitlines() cuts there.
    lines = stderr.rstrip("\n").split("\n")
    events = [json.loads(line, parse_constant=_refuse) for line in lines]
    for event in events:
        assert isinstance(event, dict)
        _no_surrogates(event)
    return events


def _executions(exec_log: Path) -> Counter[int]:
    return Counter(int(line.split()[0]) for line in exec_log.read_text().splitlines())


@pytest.mark.parametrize("poison", ["hostile.password", "hostile.poisoned"])
def test_a_poisoned_run_log_fails_no_finalize_and_no_run_runs_twice(db_url, conn, tmp_path, poison):
    exec_log = tmp_path / "executions"
    poisoned = insert_run(conn, poison)
    plain = insert_runs(conn, 3, "hostile.plain")

    err = _tick(db_url, exec_log)
    # Were a lease still held, it would be given up now, and its run claimed again.
    conn.execute("UPDATE job_runs SET locked_until = now() - interval '1 hour'")
    _tick(db_url, exec_log)

    statuses = dict(conn.execute("SELECT id, status FROM job_runs").fetchall())
    assert statuses == {run_id: "succeeded" for run_id in [poisoned, *plain]}
    assert _executions(exec_log) == {run_id: 1 for run_id in [poisoned, *plain]}
    logged = dict(conn.execute("SELECT run_id, events::text FROM job_run_logs").fetchall())
    assert sorted(logged) == sorted([poisoned, *plain])
    events = _json_lines(err)
    assert sum(e.get("event") == "plain work done" for e in events) == 3
    for secret in SECRETS:
        assert secret not in err
        assert secret not in logged[poisoned]


def test_every_line_on_stderr_is_one_json_object_whatever_a_handler_logs(db_url, conn, tmp_path):
    run_id = insert_run(conn, "hostile.poisoned")
    err = _tick(db_url, tmp_path / "executions")
    events = _json_lines(err)
    mine = [e for e in events if e.get("run_id") == run_id]
    texts = {e["event"] for e in mine}
    assert "password=***" in texts
    assert "a NUL \\x00 inside" in texts
    assert "a lone surrogate \\ud800 and \\udfff" in texts
    assert "controls \x1b[31m red \r\x07\x08 \u2028 \u202e" in texts  # JSON keeps them exact
    [huge] = [e for e in mine if e["event"] == "huge"]
    assert huge["line"] == "x" * HUGE + "password=***"
    [odd] = [e for e in mine if e["event"] == "odd values"]
    assert (odd["nan"], odd["infinity"]) == ("nan", "-inf")
    assert odd["mapping"]["db_password"] == "***"
    assert [e["level"] for e in mine if e["event"] == "it failed"] == ["error"]
    [extra] = [e for e in mine if e["event"] == "extra fields"]
    assert extra["logger"] == "shop" and extra["detail"][0] == "password=***"
    assert "%d items, and db_password=***" in texts  # its bad format string: the raw message
    [warned] = [e for e in events if e.get("logger") == "py.warnings"]
    assert 'UserWarning: a warning: "password=***' in warned["event"]
    assert events[-1]["event"] == "tick finished"


def test_a_run_log_the_database_would_refuse_is_dropped_for_its_run_alone(conn):
    from cronjob import store, transitions
    from cronjob.runlog import RunLog

    ids = insert_runs(conn, 3, "hostile.plain")
    claimed = store.runs_claim_many(
        conn, job_types=["hostile.plain"], leases=[60], max_attempts=[3], limit=3, worker="w:1"
    )
    logs = []
    for run in claimed:
        log = RunLog()
        log.add({"event": "kept", "run": run.id})
        logs.append(log)
    # No event made by jobrunner's logging is one of these: a fault of the future, or of
    # code that encodes its own events.
    logs[1].add_json('{"event": "a NUL \\u0000", "ratio": NaN}')

    store.runs_finalize_many(
        conn,
        [transitions.succeeded(r, 0.0, log) for r, log in zip(claimed, logs, strict=True)],
        worker="w:1",
    )

    statuses = conn.execute("SELECT status FROM job_runs ORDER BY id").fetchall()
    assert statuses == [("succeeded",)] * 3
    stored = dict(conn.execute("SELECT run_id, events FROM job_run_logs").fetchall())
    bad = claimed[1].id
    assert [e["event"] for e in stored[bad]] == ["this attempt's log could not be stored: dropped"]
    assert stored[bad][0]["dropped_events"] == 2
    assert all(stored[i] == [{"event": "kept", "run": i}] for i in ids if i != bad)
