"""The session's pinned clock: `jobrunner.now` moves every clock jobrunner reads in SQL.

The pytest plugin's `advance()` is that setting (cronjob.testing): the enqueue of an app
that passes no `now`, the claim's due check, a backoff, a schedule's start all read it.
Unset, or once the transaction that set it locally is over, the database clock decides
as before.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from cronjob import definitions, store
from cronjob.api import enqueue, enqueue_many, new_run
from tests.factories import insert_run

PINNED = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)


def pin(conn: Any, moment: datetime, *, local: bool = True) -> None:
    conn.execute("SELECT set_config('jobrunner.now', %s, %s)", [moment.isoformat(), local])


def claim(conn: Any, job_type: str) -> list[Any]:
    return store.runs_claim_many(
        conn, job_types=[job_type], leases=[60.0], max_attempts=[3], limit=10, worker="t:1"
    )


def test_an_enqueue_without_a_clock_of_its_own_reads_the_pinned_one(db_url):
    with psycopg.connect(db_url) as conn:
        pin(conn, PINNED)
        now_id = enqueue(conn, "t")
        later_id = enqueue(conn, "t", delay="90s")
        rows = conn.execute(
            "SELECT id, run_at, created_at FROM job_runs ORDER BY id", prepare=False
        ).fetchall()
    assert rows == [
        (now_id, PINNED, PINNED),
        (later_id, PINNED + timedelta(seconds=90), PINNED),
    ]


def test_a_bulk_copy_reads_the_pinned_clock_too(db_url):
    with psycopg.connect(db_url) as conn:
        pin(conn, PINNED)
        ids = enqueue_many(conn, [new_run("t", {"i": i}) for i in range(20)])
        stamps = conn.execute(
            "SELECT DISTINCT run_at, created_at FROM job_runs WHERE id = ANY(%s)", [ids]
        ).fetchall()
    assert stamps == [(PINNED, PINNED)]


def test_the_claim_takes_what_is_due_by_the_pinned_clock(db_url, conn):
    due = insert_run(conn, "t", run_at=PINNED - timedelta(minutes=1))
    insert_run(conn, "t", run_at=PINNED + timedelta(minutes=1))
    pin(conn, PINNED, local=False)
    try:
        claimed = claim(conn, "t")
    finally:
        conn.execute("RESET jobrunner.now")
    assert [run.id for run in claimed] == [due]
    started, lease_until = conn.execute(
        "SELECT started_at, locked_until FROM job_runs WHERE id = %s", [due]
    ).fetchone()
    assert (started, lease_until) == (PINNED, PINNED + timedelta(seconds=60))


def test_a_schedule_starts_from_the_pinned_clock(db_url):
    spec = definitions.definition_spec("hourly", cron="0 * * * *", job_type="t")
    with psycopg.connect(db_url) as conn:
        pin(conn, PINNED)
        added = definitions.add(conn, spec)
    assert added.next_fire_at == datetime(2031, 3, 4, 6, 0, tzinfo=UTC)


def test_once_its_transaction_is_over_the_database_clock_is_back(db_url):
    with psycopg.connect(db_url) as conn:
        pin(conn, PINNED)
        enqueue(conn, "t")
        conn.commit()
        run_id = enqueue(conn, "t")
        run_at, started = conn.execute(
            "SELECT run_at, now() FROM job_runs WHERE id = %s", [run_id]
        ).fetchone()
    assert run_at == started


def test_unpinned_a_claim_reads_the_database_clock(db_url, conn):
    due = insert_run(conn, "t")
    insert_run(conn, "t", run_at=datetime.now(UTC) + timedelta(hours=1))
    assert [run.id for run in claim(conn, "t")] == [due]
