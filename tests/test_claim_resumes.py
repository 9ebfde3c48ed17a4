"""A claim that resumes where the tick's last one stopped (cronjob/tick/resume.py, migration
0022): its cost stays flat while a snapshot held elsewhere keeps the dead entry of every run
claimed, and what it cannot see, a full claim finds before the tick ends."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import psycopg

import tests.handlers.basic  # noqa: F401 - registers the test handlers
from cronjob import handler, store
from cronjob.handlers import registry
from cronjob.models import ClaimedRun, Floors
from cronjob.tick.resume import RESCAN_EVERY, SPACING, Resume
from tests.factories import insert_run, insert_runs, now, tick

CLAIM = {"job_types": ["test.ok"], "leases": [60], "max_attempts": [5], "worker": "w:1"}


def floors_of(runs: list[ClaimedRun], floors: Floors | None = None) -> Floors:
    floors = dict(floors or {})
    for run in runs:
        assert run.run_at is not None
        floors[run.priority, run.tenant_id or ""] = (run.run_at, run.id)
    return floors


def entries_read(conn: Any) -> int:
    """How many entries of job_runs_dispatch this session's scans have read, the dead ones a
    snapshot held elsewhere keeps among them: the session's statistics, flushed first."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    read = conn.execute(
        "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'job_runs_dispatch'"
    )
    return read.fetchone()[0]


def test_a_claim_that_resumes_reads_no_more_for_every_run_claimed_behind_a_held_snapshot(
    db_url, conn
):
    insert_runs(conn, 3000, run_at=now("-1 minute"))
    with psycopg.connect(db_url) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1").fetchone()
        runs = store.runs_claim_many(conn, limit=100, **CLAIM)
        floors = floors_of(runs)
        read = []
        for _ in range(25):
            before = entries_read(conn)
            runs = store.runs_claim_many(conn, limit=100, floors=floors, after=runs[-1], **CLAIM)
            read.append(entries_read(conn) - before)
            assert len(runs) == 100
            floors = floors_of(runs, floors)
        before = entries_read(conn)
        full = store.runs_claim_many(conn, limit=100, after=runs[-1], **CLAIM)
        full_read = entries_read(conn) - before
        assert len(full) == 100
        # A full claim that comes back short fills from the first waiting run the walk found,
        # not from the front again.
        before = entries_read(conn)
        last = store.runs_claim_many(conn, limit=1000, after=full[-1], **CLAIM)
        last_read = entries_read(conn) - before
        assert len(last) == 300
    # 2,500 dead entries later, a claim that resumes reads what the first one did: about the
    # runs it takes. A full claim walks the dead entries.
    assert max(read) <= 110, read
    assert full_read > 2600, full_read
    assert last_read < 2 * 2700, last_read


def test_a_run_due_behind_the_floors_is_left_to_the_next_full_claim(conn):
    insert_runs(conn, 10, run_at=now("-1 minute"))
    first = store.runs_claim_many(conn, limit=5, **CLAIM)
    behind = insert_run(conn, run_at=now("-1 hour"))
    resumed = store.runs_claim_many(
        conn, limit=10, floors=floors_of(first), after=first[-1], **CLAIM
    )
    assert len(resumed) == 5 and behind not in [run.id for run in resumed]
    full = store.runs_claim_many(conn, limit=10, after=resumed[-1], **CLAIM)
    assert [run.id for run in full] == [behind]


@handler("test.enqueue_behind")
def enqueue_behind(ctx: Any, payload: Any) -> None:
    # A run due an hour ago, of a tenant the tick is past: behind every floor.
    ctx.db.execute(
        "INSERT INTO job_runs (job_type, payload, run_at, tenant_id)"
        " VALUES ('test.ok', '{}', now() - interval '1 hour', 'A')"
    )


def test_a_tick_ends_only_once_a_full_claim_finds_nothing_more(db_url, conn):
    # The tick's first run enqueues one behind where its claims will have gone on to.
    insert_run(conn, "test.enqueue_behind", tenant_id="A", run_at=now("-2 minutes"))
    insert_runs(conn, 250, tenant_id="A", run_at=now("-1 minute"))
    handlers = {"test.enqueue_behind": registry()["test.enqueue_behind"]}
    report = tick(db_url, "test.ok", handlers=handlers, batch_size=100, concurrency=1)
    assert report.claimed == 252
    waiting = conn.execute("SELECT count(*) FROM job_runs WHERE finished_at IS NULL")
    assert waiting.fetchone()[0] == 0


def runs_of(count: int, tenants: int = 1, *, limited: bool = False) -> list[ClaimedRun]:
    """`count` claimed runs over `tenants` tenants; a limited type's carry no run_at."""
    at = None if limited else datetime.now(UTC)
    return [
        ClaimedRun(i, "test.ok", {}, f"t{i % tenants}", None, 1, False, uuid4(), run_at=at)
        for i in range(count)
    ]


def ran(resume: Resume, count: int, *, tenants: int = 1, at: float, limit: int = 100) -> None:
    """A claim sent at `at` came back 10 ms later with `count` runs over `tenants`."""
    resumed = resume.floors_for(at) is not None
    resume.took(runs_of(count, tenants), limit=limit, resumed=resumed, sent=at, now=at + 0.01)


def test_a_tick_claims_in_full_first_then_resumes():
    resume = Resume()
    assert resume.floors_for(0.0) is None
    ran(resume, 100, at=0.0)
    assert resume.floors_for(0.1) == {(0, "t0"): resume.floors[0, "t0"]}


def test_a_claim_that_resumed_and_came_back_short_is_followed_by_a_full_one():
    resume = Resume()
    ran(resume, 100, at=0.0)
    ran(resume, 40, at=0.1)
    assert resume.floors_for(0.2) is None


def test_a_full_claim_comes_every_second_or_twenty_times_as_long_as_the_last_took():
    quick = Resume()
    ran(quick, 100, at=0.0)
    assert quick.floors_for(RESCAN_EVERY - 0.1) is not None
    assert quick.floors_for(RESCAN_EVERY + 0.1) is None
    slow = Resume()
    slow.took(runs_of(100), limit=100, resumed=False, sent=0.0, now=0.5)
    assert slow.floors_for(0.5 + SPACING * 0.5 - 0.1) is not None
    assert slow.floors_for(0.5 + SPACING * 0.5 + 0.1) is None


def test_the_runs_of_a_limited_type_leave_nothing_to_resume_from():
    resume = Resume()
    resume.took(runs_of(100, limited=True), limit=100, resumed=False, sent=0.0, now=0.01)
    assert resume.floors_for(0.1) is None


def test_with_as_many_tenants_as_a_claim_holds_every_claim_is_full():
    resume = Resume()
    ran(resume, 100, tenants=100, at=0.0)
    assert resume.floors_for(0.1) is None
    ran(resume, 100, tenants=99, at=0.2)
    assert resume.floors_for(0.3) is not None
