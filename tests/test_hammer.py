"""The hammer: many real `jobrunner tick` processes drain one backlog, each run exactly once."""

from __future__ import annotations

import subprocess
from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.conftest import count, jobrunner_process, wait_for
from tests.factories import insert_runs

JOBS = 5000
TICKS = 8


def _waiting(conn: psycopg.Connection[Any], ticks: list[subprocess.Popen[str]]) -> int:
    """How many sessions wait for a lock on job_runs; fails at once if a tick ended."""
    for tick in ticks:
        if tick.poll() is not None:
            raise AssertionError(f"a tick ended before the gate opened: {tick.communicate()[1]}")
    return count(
        conn,
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'job_runs'::regclass",
    )


@pytest.mark.parametrize(
    ("job_type", "handlers"),
    [("test.ok", "tests.handlers.basic"), ("aio.recorded", "tests.handlers.aio")],
    ids=["plain", "async"],
)
def test_eight_concurrent_ticks_execute_each_of_5000_jobs_exactly_once(
    db_url, conn, tmp_path, job_type, handlers
):
    insert_runs(conn, JOBS, job_type, payload=sql.SQL("jsonb_build_object('i', i)"))
    exec_log = tmp_path / "executions.log"
    # Every tick waits at the table until all of them are there: one that started first
    # would otherwise drain the backlog alone on a machine fast enough.
    gate = psycopg.connect(db_url)
    gate.execute("LOCK TABLE job_runs IN ACCESS EXCLUSIVE MODE")
    ticks = [
        jobrunner_process(
            "tick",
            "--database-url",
            db_url,
            "--handlers",
            handlers,
            "--concurrency",
            "4",
            "--batch-size",
            "50",
            "--max-runtime",
            "120s",
            env={"JOBRUNNER_TEST_EXEC_LOG": str(exec_log)},
        )
        for _ in range(TICKS)
    ]
    try:
        wait_for(lambda: _waiting(conn, ticks) >= TICKS, "every tick to wait at the gate", 60)
    finally:
        gate.rollback()
        gate.close()
    for tick in ticks:
        _, stderr = tick.communicate(timeout=180)
        assert tick.returncode == 0, stderr[-2000:]

    executions = Counter(int(line.split()[0]) for line in exec_log.read_text().splitlines())
    ids = {r[0] for r in conn.execute("SELECT id FROM job_runs")}
    assert len(ids) == JOBS
    assert set(executions) == ids
    assert max(executions.values()) == 1
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status <> 'succeeded'") == 0
    assert count(conn, "SELECT count(*) FROM job_runs WHERE attempts <> 1") == 0
    workers = {line.split()[2] for line in exec_log.read_text().splitlines()}
    assert len(workers) > 1  # the work really was shared
