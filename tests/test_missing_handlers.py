"""Due runs of job types no tick has a handler for: the tick says so once, status names them."""

from __future__ import annotations

import json

from cronjob.api import enqueue
from tests.conftest import jobrunner_process

WARNING = "due runs have no handler loaded"


def _tick(db_url: str, *args: str) -> list[dict]:
    process = jobrunner_process("tick", "--database-url", db_url, *args)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [e for e in events if e.get("event") == WARNING]


def test_a_tick_names_once_the_due_types_it_has_no_handler_for(db_url, conn):
    for _ in range(3):
        enqueue(conn, "test.ok", {})
    enqueue(conn, "app.unloaded", {})
    enqueue(conn, "app.unloaded", {})
    # One run a claim: several claims, one line.
    [line] = _tick(
        db_url, "--handlers", "tests.handlers.basic", "--types", "test.ok", "--batch-size", "1"
    )
    assert line["job_types"] == ["app.unloaded"] and line["level"] == "warning"
    assert "--handlers" in line["hint"] and "--handlers-path" in line["hint"]
    assert "JOBRUNNER_HANDLERS" in line["hint"] and "entry points" in line["hint"]
    statuses = dict(conn.execute("SELECT job_type, status FROM job_runs").fetchall())
    assert statuses == {"test.ok": "succeeded", "app.unloaded": "queued"}


def test_a_tick_without_any_handler_says_so_when_runs_are_due(db_url, conn):
    enqueue(conn, "app.un\x1bloaded", {})
    [line] = _tick(db_url)
    assert line["job_types"] == ["app.un\\x1bloaded"]


def test_a_type_another_tick_handles_is_not_named(db_url, conn):
    enqueue(conn, "test.ok", {})
    assert _tick(db_url, "--handlers", "tests.handlers.basic", "--types", "test.ok") == []
    enqueue(conn, "test.ok", {})
    # This host handles nothing; test.ok's handler was seen a moment ago elsewhere.
    assert _tick(db_url) == []


def test_an_idle_tick_names_nothing(db_url, conn):
    assert _tick(db_url, "--handlers", "tests.handlers.basic") == []


def test_status_names_due_types_no_tick_had_a_handler_for(db_url, conn):
    from tests.test_ops import cli, cli_json

    enqueue(conn, "test.ok", {})
    assert _tick(db_url, "--handlers", "tests.handlers.basic", "--types", "test.ok") == []
    enqueue(conn, "test.ok", {})
    enqueue(conn, "app.unloaded", {})
    assert cli_json(db_url, "status")["no_handler_seen_job_types"] == ["app.unloaded"]
    shown = cli(db_url, "status").stdout
    assert "no handler seen" in shown and "app.unloaded" in shown
    [line] = [x for x in shown.splitlines() if "no handler seen" in x]
    assert "test.ok" not in line
