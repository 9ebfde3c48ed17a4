"""Every lifecycle transition, driven through the library on a real database.

Time is driven through the database: ticks are given a `now` instead of sleeping.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import psycopg
import pytest
from psycopg import sql

import tests.handlers.basic  # noqa: F401 - registers the test handlers
from cronjob import store
from cronjob.api import enqueue
from cronjob.report import TickReport
from tests.conftest import count
from tests.factories import insert_run, insert_runs, now, tick


def db_now(conn: psycopg.Connection[Any]) -> datetime:
    return conn.execute("SELECT now()").fetchone()[0]


def claim_as(conn: psycopg.Connection[Any], worker: str, *, lease: float) -> list[Any]:
    """Claim one test.ok run as some other worker would, outside any tick."""
    return store.runs_claim_many(
        conn, job_types=["test.ok"], leases=[lease], max_attempts=[5], limit=1, worker=worker
    )


def run_row(conn: psycopg.Connection[Any], run_id: int) -> Any:
    run = store.run_get(conn, run_id)
    assert run is not None
    return run


def test_a_queued_run_is_claimed_run_and_succeeds(db_url, conn):
    run_id = enqueue(conn, "test.ok", {"n": 1})
    assert run_row(conn, run_id).status == "queued"

    report = tick(db_url, "test.ok")

    run = run_row(conn, run_id)
    assert (report.claimed, report.succeeded) == (1, 1)
    assert run.status == "succeeded"
    assert run.attempts == 1
    assert run.finished_at is not None and run.started_at is not None
    assert run.locked_by is None and run.locked_until is None


def test_a_failing_run_is_retried_later_with_backoff_then_goes_dead(db_url, conn):
    run_id = enqueue(conn, "test.fail", {"message": "smtp down"})

    tick(db_url, "test.fail")
    run = run_row(conn, run_id)
    assert run.status == "failed"
    assert run.attempts == 1
    assert run.last_error == "smtp down" and run.error_type == "RuntimeError"
    assert run.run_at > run.started_at  # backoff puts it in the future

    # Not due yet: a tick now leaves it alone.
    assert tick(db_url, "test.fail").claimed == 0

    later = db_now(conn) + timedelta(days=1)
    tick(db_url, "test.fail", now=later)
    tick(db_url, "test.fail", now=later + timedelta(days=1))
    run = run_row(conn, run_id)
    assert run.status == "dead"
    assert run.attempts == 3 == run.max_attempts
    history = store.run_attempts_get(conn, run_id)
    assert [a.attempt for a in history] == [1, 2, 3]
    assert {a.error_type for a in history} == {"RuntimeError"}
    assert all(a.traceback and "RuntimeError: smtp down" in a.traceback for a in history)


def test_fail_sends_a_run_straight_to_dead(db_url, conn):
    run_id = enqueue(conn, "test.give_up")
    report = tick(db_url, "test.give_up")
    run = run_row(conn, run_id)
    assert report.dead == 1
    assert (run.status, run.attempts, run.error_type) == ("dead", 1, "Fail")
    assert run.last_error == "permanently broken"


def test_retry_with_a_delay_makes_the_run_due_after_that_delay(db_url, conn):
    run_id = enqueue(conn, "test.retry_in", {"delay": "10m"})
    tick(db_url, "test.retry_in")
    run = run_row(conn, run_id)
    assert run.status == "failed"
    assert timedelta(minutes=10) <= run.run_at - run.started_at < timedelta(minutes=10, seconds=5)


def test_the_handler_max_attempts_is_written_at_first_claim(db_url, conn):
    run_id = enqueue(conn, "test.fail")
    assert run_row(conn, run_id).max_attempts is None
    tick(db_url, "test.fail")
    assert run_row(conn, run_id).max_attempts == 3


def test_max_attempts_given_at_enqueue_wins_over_the_handler_default(db_url, conn):
    run_id = enqueue(conn, "test.fail", max_attempts=1)
    tick(db_url, "test.fail")
    assert run_row(conn, run_id).status == "dead"


def test_a_tick_claims_only_types_it_has_handlers_for(db_url, conn):
    mine = enqueue(conn, "test.ok")
    other = enqueue(conn, "somebody.else")
    tick(db_url, "test.ok")
    assert run_row(conn, mine).status == "succeeded"
    untouched = run_row(conn, other)
    assert (untouched.status, untouched.attempts, untouched.locked_by) == ("queued", 0, None)


def test_runs_are_claimed_by_priority_then_due_time(db_url, conn):
    now = db_now(conn)
    late = enqueue(conn, "test.ok", run_at=now - timedelta(minutes=1))
    early = enqueue(conn, "test.ok", run_at=now - timedelta(minutes=5))
    urgent = enqueue(conn, "test.ok", priority=-1)
    tick(db_url, "test.ok", batch_size=1, concurrency=1)
    order = [
        r[0] for r in conn.execute("SELECT id FROM job_runs ORDER BY finished_at, id").fetchall()
    ]
    assert order == [urgent, early, late]


def test_a_run_scheduled_in_the_future_waits(db_url, conn):
    run_id = enqueue(conn, "test.ok", delay="1h")
    assert tick(db_url, "test.ok").claimed == 0
    tick(db_url, "test.ok", now=db_now(conn) + timedelta(hours=1, seconds=1))
    assert run_row(conn, run_id).status == "succeeded"


def test_an_expired_lease_is_rescued_and_the_lost_attempt_recorded(db_url, conn):
    run_id = enqueue(conn, "test.ok")
    claimed = claim_as(conn, "ghost:1", lease=60)
    assert [c.id for c in claimed] == [run_id]

    # Still leased: nobody takes it.
    assert tick(db_url, "test.ok").claimed == 0

    report = tick(db_url, "test.ok", now=db_now(conn) + timedelta(minutes=2))
    assert report.rescued == 1 and report.succeeded == 1
    run = run_row(conn, run_id)
    assert (run.status, run.attempts) == ("succeeded", 2)
    [lost] = store.run_attempts_get(conn, run_id)
    assert (lost.attempt, lost.error_type, lost.worker) == (1, "lease_expired", "ghost:1")
    assert "lease expired" in lost.message


def test_a_run_that_keeps_losing_its_lease_goes_dead_when_attempts_run_out(db_url, conn):
    run_id = enqueue(conn, "test.ok", max_attempts=1)
    claim_as(conn, "ghost:1", lease=60)
    tick(db_url, "test.ok", now=db_now(conn) + timedelta(minutes=2))
    run = run_row(conn, run_id)
    assert (run.status, run.error_type) == ("dead", "lease_expired")


@pytest.mark.parametrize("max_attempts", [1, 2, 3])
def test_an_error_and_a_lost_lease_on_the_same_attempt_end_in_the_same_status(
    db_url, conn, max_attempts
):
    """The runner's decision and rescue apply one rule for the final attempt."""
    from cronjob import transitions
    from cronjob.handlers import Backoff
    from cronjob.models import Errored

    errored = enqueue(conn, "test.ok", max_attempts=max_attempts)
    crashed = enqueue(conn, "test.ok", max_attempts=max_attempts)
    now = db_now(conn)
    for attempt in range(1, max_attempts + 1):
        now += timedelta(minutes=2)
        held = store.runs_claim_many(
            conn,
            job_types=["test.ok"],
            leases=[60],
            max_attempts=[5],
            limit=2,
            worker="w:1",
            now=now,
        )
        assert sorted(r.id for r in held) == [errored, crashed]
        assert {r.final_attempt for r in held} == {attempt == max_attempts}
        [run] = [r for r in held if r.id == errored]
        decision = transitions.decide(run, Errored("E", "m", retry_delay=0.0), Backoff())
        store.runs_finalize_many(conn, [decision], worker="w:1", now=now)
        store.runs_rescue_many(conn, now=now + timedelta(seconds=90))
        statuses = {run_row(conn, errored).status, run_row(conn, crashed).status}
        assert statuses == {"dead" if attempt == max_attempts else "failed"}


def test_a_stale_worker_cannot_overwrite_a_newer_outcome(db_url, conn):
    run_id = enqueue(conn, "test.ok")
    [stale] = claim_as(conn, "stale:1", lease=60)
    tick(db_url, "test.ok", now=db_now(conn) + timedelta(minutes=2))
    assert run_row(conn, run_id).status == "succeeded"

    from cronjob import transitions
    from cronjob.models import Errored

    decision = transitions.dead(stale, Errored("RuntimeError", "late"))
    assert store.runs_finalize_many(conn, [decision], worker="stale:1") == set()
    assert run_row(conn, run_id).status == "succeeded"


def test_a_claim_leases_its_runs_under_one_token_that_fences_only_that_claim(db_url, conn):
    ids = [enqueue(conn, "test.ok") for _ in range(3)]
    claim = partial(
        store.runs_claim_many, conn, job_types=["test.ok"], leases=[60], max_attempts=[5], limit=2
    )
    first, second = claim(worker="a:1"), claim(worker="b:1")
    assert [r.id for r in first + second] == ids

    assert len({r.lease_token for r in first}) == 1
    assert first[0].lease_token != second[0].lease_token
    stored = dict(conn.execute("SELECT id, lease_token FROM job_runs").fetchall())
    assert stored == {r.id: r.lease_token for r in first + second}

    from cronjob import transitions

    # Another claim's token is no lease on this run, though both are current.
    forged = first[0]._replace(lease_token=second[0].lease_token)
    assert store.runs_finalize_many(conn, [transitions.succeeded(forged)], worker="b:1") == set()
    assert run_row(conn, first[0].id).status == "running"
    done = store.runs_finalize_many(conn, [transitions.succeeded(r) for r in first], worker="a:1")
    assert done == {r.id for r in first}


def test_cancel_moves_queued_and_failed_runs_to_cancelled(db_url, conn):
    queued = enqueue(conn, "test.ok")
    failed = enqueue(conn, "test.fail")
    tick(db_url, "test.fail")
    changes = store.runs_cancel_many(conn, [queued, failed, 999])
    assert [(c.id, c.changed) for c in changes] == [(queued, True), (failed, True), (999, False)]
    assert changes[2].previous is None
    for run_id in (queued, failed):
        run = run_row(conn, run_id)
        assert run.status == "cancelled" and run.finished_at is not None
    assert tick(db_url, "test.ok", "test.fail", now=db_now(conn) + timedelta(days=1)).claimed == 0


def test_cancelling_a_running_run_discards_its_outcome(db_url, conn):
    run_id = enqueue(conn, "test.ok")
    [held] = claim_as(conn, "w:1", lease=60)
    store.runs_cancel_many(conn, [run_id])
    from cronjob import transitions

    assert store.runs_finalize_many(conn, [transitions.succeeded(held)], worker="w:1") == set()
    assert run_row(conn, run_id).status == "cancelled"


def test_cancel_refuses_terminal_runs(db_url, conn):
    run_id = enqueue(conn, "test.ok")
    tick(db_url, "test.ok")
    [change] = store.runs_cancel_many(conn, [run_id])
    assert (change.changed, change.previous) == (False, "succeeded")


def test_retry_gives_a_dead_run_a_fresh_budget_and_keeps_its_history(db_url, conn):
    run_id = enqueue(conn, "test.give_up")
    tick(db_url, "test.give_up")
    assert run_row(conn, run_id).status == "dead"

    [change] = store.runs_retry_many(conn, [run_id])
    assert change.changed
    run = run_row(conn, run_id)
    assert (run.status, run.attempts, run.finished_at) == ("queued", 0, None)
    assert run.run_at <= db_now(conn)
    tick(db_url, "test.give_up")
    assert [a.attempt for a in store.run_attempts_get(conn, run_id)] == [1, 1]


def test_retry_makes_a_waiting_failed_run_due_now(db_url, conn):
    run_id = enqueue(conn, "test.fail")
    tick(db_url, "test.fail")
    store.runs_retry_many(conn, [run_id])
    run = run_row(conn, run_id)
    assert (run.status, run.attempts) == ("failed", 1)
    assert run.run_at <= db_now(conn)


def test_retry_clears_the_lock_of_a_running_run(db_url, conn):
    run_id = enqueue(conn, "test.ok")
    claim_as(conn, "w:1", lease=600)
    store.runs_retry_many(conn, [run_id])
    run = run_row(conn, run_id)
    assert (run.status, run.locked_by, run.locked_until) == ("failed", None, None)
    tick(db_url, "test.ok")
    assert run_row(conn, run_id).status == "succeeded"


def test_retry_refuses_a_succeeded_run(db_url, conn):
    run_id = enqueue(conn, "test.ok")
    tick(db_url, "test.ok")
    [change] = store.runs_retry_many(conn, [run_id])
    assert (change.changed, change.previous) == (False, "succeeded")


def test_hand_back_returns_a_run_as_if_never_claimed(db_url, conn):
    run_id = enqueue(conn, "test.ok")
    held = claim_as(conn, "w:1", lease=600)
    assert store.runs_hand_back_many(conn, held) == {run_id}
    run = run_row(conn, run_id)
    assert (run.status, run.attempts, run.locked_until, run.started_at) == ("queued", 0, None, None)
    assert run.run_at <= db_now(conn)


def test_the_finished_at_constraint_forbids_a_terminal_run_without_a_finish_time(conn):
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO job_runs (job_type, status) VALUES ('x', 'succeeded')")


def test_enqueue_joins_the_callers_transaction(db_url, conn):
    with psycopg.connect(db_url) as app:
        with app.transaction():
            enqueue(app, "test.ok", {"order": 1})
            enqueue(app, "test.ok", {"order": 2})
        with pytest.raises(ZeroDivisionError), app.transaction():
            enqueue(app, "test.ok", {"order": 3})
            raise ZeroDivisionError
    orders = sorted(r[0] for r in conn.execute("SELECT payload->>'order' FROM job_runs"))
    assert orders == ["1", "2"]


def test_an_existing_idempotency_key_returns_the_existing_run(conn):
    first = enqueue(conn, "test.ok", {"v": 1}, idempotency_key="weekly:1:2026-01-05")
    again = enqueue(conn, "test.ok", {"v": 2}, idempotency_key="weekly:1:2026-01-05")
    assert first == again
    assert count(conn, "SELECT count(*) FROM job_runs") == 1
    assert conn.execute("SELECT payload FROM job_runs").fetchone()[0] == {"v": 1}


def test_duplicate_keys_within_one_batch_get_one_run(conn):
    from cronjob.api import new_run

    results = store.runs_insert_many(
        conn,
        [
            new_run("test.ok", idempotency_key="k"),
            new_run("test.ok"),
            new_run("test.ok", idempotency_key="k"),
        ],
    )
    assert results[0].id == results[2].id != results[1].id
    assert [r.created for r in results] == [True, True, False]
    assert count(conn, "SELECT count(*) FROM job_runs") == 2


def test_a_success_recorded_in_the_handlers_transaction_has_its_real_finish_time(db_url, conn):
    run_id = enqueue(conn, "test.db_then_wait", {"seconds": 0.3})
    tick(db_url, "test.db_then_wait")
    run = run_row(conn, run_id)
    assert run.status == "succeeded"
    assert (run.finished_at - run.started_at).total_seconds() >= 0.3


def test_a_claimed_batch_starts_in_priority_order(db_url, conn, tmp_path, monkeypatch):
    exec_log = tmp_path / "executions.log"
    monkeypatch.setenv("JOBRUNNER_TEST_EXEC_LOG", str(exec_log))
    now = db_now(conn)
    ids = {
        "late": enqueue(conn, "test.ok", run_at=now - timedelta(minutes=1)),
        "urgent": enqueue(conn, "test.ok", priority=-5),
        "early": enqueue(conn, "test.ok", run_at=now - timedelta(minutes=5)),
        "lazy": enqueue(conn, "test.ok", priority=5, run_at=now - timedelta(hours=1)),
    }
    tick(db_url, "test.ok", batch_size=10, concurrency=1)
    order = [int(line.split()[0]) for line in exec_log.read_text().splitlines()]
    assert order == [ids["urgent"], ids["early"], ids["late"], ids["lazy"]]


def test_slow_runs_are_claimed_no_faster_than_they_start(db_url, conn):
    # 40 runs of 0.1 s on 2 workers start at most 20 a second: the tick keeps
    # about a second's worth waiting, not its whole batch, so other hosts can
    # take the rest.
    for _ in range(40):
        enqueue(conn, "test.sleep", {"seconds": 0.1})
    import threading

    reports: list[TickReport] = []
    runner = threading.Thread(
        target=lambda: reports.append(tick(db_url, "test.sleep", concurrency=2, batch_size=100))
    )
    runner.start()
    held = 0
    while runner.is_alive():
        held = max(held, count(conn, "SELECT count(*) FROM job_runs WHERE status = 'running'"))
        runner.join(0.02)
    assert reports and reports[0].succeeded == 40
    assert 2 <= held <= 2 + 20 + 2


def test_the_queue_table_is_vacuumed_after_a_fixed_amount_of_churn(conn):
    [options] = conn.execute(
        "SELECT reloptions FROM pg_class WHERE oid = 'job_runs'::regclass"
    ).fetchone()
    settings = dict(option.split("=", 1) for option in options)
    assert float(settings["autovacuum_vacuum_scale_factor"]) <= 0.01
    assert int(settings["autovacuum_vacuum_threshold"]) > 0


def test_new_runs_go_to_pages_of_their_own_not_the_gaps_in_finished_history(conn):
    insert_runs(conn, 5000, status="succeeded", attempts=1, started_at=now())
    conn.execute("VACUUM job_runs")
    # A little smaller than a finished run: one would fit in each history page's leftover.
    insert_runs(conn, 300)
    pages = count(
        conn,
        "SELECT count(DISTINCT (ctid::text::point)[0]) FROM job_runs WHERE status = 'queued'",
    )
    assert pages <= 10  # about 40 runs to a page; one run to a page would be 80 pages


def test_a_claim_walks_the_dispatch_index_in_order_even_before_any_statistics(conn):
    # Truncated and never analyzed, the table looks nearly empty to the planner,
    # which then prefers to fetch and sort every runnable row on each claim.
    insert_runs(conn, 3000)
    plans: list[str] = []
    try:
        conn.execute("LOAD 'auto_explain'")
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("loading auto_explain needs a superuser")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_level = 'notice'")
    # The claim chooses its runs in functions (migration 0021): their statements' plans too.
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))

    from cronjob import transitions

    claim = {"job_types": ["test.ok"], "leases": [60], "max_attempts": [5], "worker": "w:1"}
    first = store.runs_claim_many(conn, limit=100, **claim)
    # The second claim resumes after the first (tick/resume.py).
    floors = {(run.priority, run.tenant_id or ""): (run.run_at, run.id) for run in first}
    done = [transitions.succeeded(r) for r in first]
    store.runs_finalize_and_claim_many(
        conn, done, limit=100, floors=floors, after=first[-1], **claim
    )

    # Each claim locks its runs in one statement: a range scan of one tenant's runs.
    locking = [plan for plan in plans if "FOR UPDATE SKIP LOCKED" in plan and "LockRows" in plan]
    assert len(locking) == 2
    for plan in locking:
        assert "Index Scan using job_runs_dispatch" in plan
        assert "Bitmap" not in plan
        # Nothing is sorted: the scan gives the runs in order.
        assert "Sort Key" not in plan, plan
    # The claim itself sorts only what it hands over.
    claims = [
        plan for plan in plans if "jobrunner_claimable_resumed(" in plan and "Update on" in plan
    ]
    assert len(claims) == 2
    for plan in claims:
        assert re.findall(r"Sort Key: (.*)", plan) == ["handed.place"], plan


def test_a_claimed_payload_reads_as_the_stored_json(conn):
    payload = {
        "text": 'é \u2028 \\ "q"',
        "big": 2**70,
        "ratio": 0.1,
        "exp": 1e300,
        "flags": [True, False, None],
        "nested": {"a": [1, {"b": []}]},
        "": "",
    }
    run_id = enqueue(conn, "test.ok", payload)
    [claimed] = claim_as(conn, "someone:1", lease=60)
    stored = conn.execute("SELECT payload FROM job_runs WHERE id = %s", (run_id,)).fetchone()[0]
    assert claimed.payload == stored  # what psycopg's jsonb loader gives
    assert claimed.payload["exp"] == 10**300  # jsonb keeps numbers as numeric
    assert {**claimed.payload, "exp": 1e300} == payload


def test_a_payload_python_cannot_decode_fails_its_own_run_only(db_url, conn):
    # Written by someone else's SQL: valid JSON to PostgreSQL, nested too deep for Python.
    deep = insert_run(conn, payload=sql.SQL("(repeat('[', 5000) || repeat(']', 5000))::jsonb"))
    innocent = [enqueue(conn, "test.ok", {"n": n}) for n in range(3)]

    report = tick(db_url, "test.ok")

    assert (report.claimed, report.succeeded, report.dead) == (4, 3, 1)
    assert {run_row(conn, i).status for i in innocent} == {"succeeded"}
    run = run_row(conn, deep)
    assert (run.status, run.attempts, run.error_type) == ("dead", 1, "UnreadablePayload")
    assert "nested too deeply" in run.last_error
