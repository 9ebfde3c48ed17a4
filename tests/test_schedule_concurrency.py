"""Six real `jobrunner tick` processes, released at the same instant over the same due
schedules: each occurrence becomes exactly one run, and each run executes exactly once."""

from __future__ import annotations

import json
import time
from collections import Counter

import psycopg

from tests.conftest import count, jobrunner_process

GLOBAL_DEFINITIONS = 200
TENANTS = 100
TICKS = 6

# Real processes read the real database clock, so due occurrences are arranged by moving the
# high-water marks back: a yearly schedule three years behind has three missed occurrences,
# and the default policy (latest) makes one run of the newest, the last 1 January.
SETUP = """
INSERT INTO job_definitions (name, job_type, schedule, scope, materialized_through, next_fire_at)
SELECT name, 'test.ok', '0 0 1 1 *', scope, year - interval '3 years', year - interval '2 years'
FROM (SELECT date_trunc('year', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS year) y,
     (SELECT 'global-' || i AS name, 'global' AS scope FROM generate_series(1, %(globals)s) i
      UNION ALL SELECT 'per-tenant', 'tenant') d
"""


def test_six_ticks_materialize_and_run_every_occurrence_exactly_once(db_url, conn, tmp_path):
    conn.execute("DROP TABLE IF EXISTS tenants")
    conn.execute("CREATE TABLE tenants (id text PRIMARY KEY)")
    conn.execute(
        "INSERT INTO tenants SELECT 'tenant-' || i FROM generate_series(1, %s) i", [TENANTS]
    )
    conn.execute(SETUP, {"globals": GLOBAL_DEFINITIONS})
    [year] = conn.execute(
        "SELECT date_trunc('year', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
    ).fetchone()
    exec_log = tmp_path / "executions.log"

    with psycopg.connect(db_url) as gate:
        # Plain reads pass this lock, FOR UPDATE does not: every tick gets as far as locking
        # its first batch of definitions, and waits there until all are released together.
        gate.execute("LOCK TABLE job_definitions IN EXCLUSIVE MODE")
        ticks = [
            jobrunner_process(
                "tick",
                "--database-url",
                db_url,
                "--handlers",
                "tests.handlers.basic",
                "--tenants-sql",
                "SELECT id FROM tenants",
                "--batch-size",
                "3",
                "--concurrency",
                "4",
                "--json",
                env={"JOBRUNNER_TEST_EXEC_LOG": str(exec_log)},
            )
            for _ in range(TICKS)
        ]
        _wait_for_waiters(conn, TICKS, timeout=3.0)
        gate.rollback()

    summaries = []
    for tick in ticks:
        stdout, stderr = tick.communicate(timeout=60)
        assert tick.returncode == 0, stderr[-2000:]
        summaries.append(json.loads(stdout))
    conn.execute("DROP TABLE tenants")

    expected_runs = GLOBAL_DEFINITIONS + TENANTS
    assert sum(s["materialized"] for s in summaries) == expected_runs
    assert sum(s["succeeded"] for s in summaries) == expected_runs
    runs = conn.execute(
        "SELECT r.id, d.name, r.tenant_id, r.scheduled_for, r.status, r.attempts"
        " FROM job_runs r JOIN job_definitions d ON d.id = r.definition_id"
    ).fetchall()
    assert len(runs) == expected_runs
    per_definition = Counter(name for _, name, _, _, _, _ in runs)
    assert per_definition == {
        **{f"global-{i}": 1 for i in range(1, GLOBAL_DEFINITIONS + 1)},
        "per-tenant": TENANTS,
    }
    tenants = sorted(tenant for _, name, tenant, _, _, _ in runs if name == "per-tenant")
    assert tenants == sorted(f"tenant-{i}" for i in range(1, TENANTS + 1))
    assert {scheduled_for for _, _, _, scheduled_for, _, _ in runs} == {year}
    assert {(status, attempts) for _, _, _, _, status, attempts in runs} == {("succeeded", 1)}

    executions = Counter(int(line.split()[0]) for line in exec_log.read_text().splitlines())
    assert set(executions) == {run_id for run_id, *_ in runs}
    assert max(executions.values()) == 1

    marks = conn.execute(
        "SELECT DISTINCT materialized_through, next_fire_at FROM job_definitions"
    ).fetchall()
    assert len(marks) == 1 and marks[0][0] == year
    assert marks[0][1] == year.replace(year=year.year + 1)
    assert count(conn, "SELECT count(*) FROM job_definitions WHERE next_fire_at <= now()") == 0


def _wait_for_waiters(conn: psycopg.Connection, expected: int, *, timeout: float) -> None:
    """Until `expected` sessions wait for a lock on job_definitions (or `timeout` passes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = count(
            conn,
            "SELECT count(*) FROM pg_locks"
            " WHERE NOT granted AND relation = 'job_definitions'::regclass",
        )
        if waiting >= expected:
            return
        time.sleep(0.02)
