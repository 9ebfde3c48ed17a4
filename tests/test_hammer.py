"""The hammer: many real `jobrunner tick` processes drain one backlog, each run exactly once."""

from __future__ import annotations

from collections import Counter

import pytest
from psycopg import sql

from tests.conftest import count, jobrunner_process
from tests.factories import insert_runs

JOBS = 5000
TICKS = 8


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
