"""Promises about a run's lease and its retries, held at fixed inputs.

A stale lease token (a tick that stalled, whose run was then cancelled, retried or claimed
by another tick) can neither renew the lease nor hand the run back; a hand-back returns a
run to the status its earlier attempts left it in; an unexpired lease is never rescued; a
handler's own backoff spaces its retries. Time moves through `now=`, never by sleeping.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from cronjob import store
from cronjob.db import Database
from cronjob.handlers import registry
from cronjob.models import ClaimedRun
from cronjob.tick.connection import ConnectionKeeper
from cronjob.tick.flight import Flight
from cronjob.tick.leases import LeaseKeeper
from tests.conftest import count, jobrunner_process, wait_for
from tests.factories import insert_run, insert_runs, tick
from tests.handlers import aio, basic, faults  # noqa: F401 - register the test handlers
from tests.test_effects import Background
from tests.test_lifecycle import db_now, run_row

LATER = timedelta(minutes=10)  # past any lease a stalled tick took here


def claim(
    conn: psycopg.Connection[Any],
    worker: str,
    job_type: str = "test.ok",
    *,
    lease: float = 60,
    now: datetime | None = None,
) -> ClaimedRun:
    """One run of `job_type` claimed as `worker` would, outside any tick."""
    [run] = store.runs_claim_many(
        conn,
        job_types=[job_type],
        leases=[lease],
        max_attempts=[5],
        limit=1,
        worker=worker,
        now=now,
    )
    return run


def lease_of(conn: psycopg.Connection[Any], run_id: int) -> tuple[Any, ...]:
    """Everything about a run that a worker's write could change."""
    return conn.execute(
        "SELECT status, attempts, run_at, locked_by, locked_until, lease_token, started_at,"
        " finished_at, last_error FROM job_runs WHERE id = %s",
        [run_id],
    ).fetchone()


def taken_by_another_tick(conn: psycopg.Connection[Any], stale: ClaimedRun) -> None:
    """The stalled tick's lease ran out: rescued, then claimed by another tick."""
    later = db_now(conn) + LATER
    assert store.runs_rescue_many(conn, now=later) == [stale.id]
    claim(conn, "other:2", stale.job_type, lease=3600, now=later)


def cancelled(conn: psycopg.Connection[Any], stale: ClaimedRun) -> None:
    store.runs_cancel_many(conn, [stale.id])


def retried(conn: psycopg.Connection[Any], stale: ClaimedRun) -> None:
    store.runs_retry_many(conn, [stale.id])


def claim_of(conn: psycopg.Connection[Any], run_id: int) -> ClaimedRun:
    """The run as its current holder knows it."""
    token, attempts = conn.execute(
        "SELECT lease_token, attempts FROM job_runs WHERE id = %s", [run_id]
    ).fetchone()
    return ClaimedRun(run_id, "test.ok", {}, None, None, attempts, False, token)


TAKEN: dict[str, Callable[[psycopg.Connection[Any], ClaimedRun], None]] = {
    "claimed by another tick": taken_by_another_tick,
    "cancelled": cancelled,
    "retried by an operator": retried,
}


# -- the lease fence: heartbeat and hand-back --------------------------------------


@pytest.mark.parametrize("taken", TAKEN.values(), ids=TAKEN.keys())
def test_a_stale_lease_token_renews_no_lease(conn, taken):
    insert_run(conn)
    stale = claim(conn, "stalled:1")
    taken(conn, stale)
    before = lease_of(conn, stale.id)

    assert store.runs_heartbeat_many(conn, [stale], [3600]) == {}
    assert lease_of(conn, stale.id) == before


@pytest.mark.parametrize("taken", TAKEN.values(), ids=TAKEN.keys())
@pytest.mark.parametrize("door", ["by run", "by claim"])
def test_a_stale_lease_token_hands_nothing_back(conn, taken, door):
    insert_run(conn)
    stale = claim(conn, "stalled:1")
    taken(conn, stale)
    before = lease_of(conn, stale.id)

    if door == "by run":
        assert store.runs_hand_back_many(conn, [stale]) == set()
    else:
        assert store.runs_hand_back_claim(conn, stale.lease_token) == []
    assert lease_of(conn, stale.id) == before


def test_the_current_holder_still_renews_and_hands_back_its_run(conn):
    insert_run(conn)
    stale = claim(conn, "stalled:1")
    taken_by_another_tick(conn, stale)
    current = claim_of(conn, stale.id)

    renewed = store.runs_heartbeat_many(conn, [current], [3600])
    assert list(renewed) == [stale.id]
    assert store.runs_hand_back_many(conn, [current]) == {stale.id}
    assert run_row(conn, stale.id).status == "failed"  # its rescued attempt counts


class Log:
    """A logger that keeps nothing: what these parts log is not the point here."""

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: None


def test_a_stalled_ticks_lease_keeper_finds_its_run_lost_and_hands_back_nothing(db_url, conn):
    insert_run(conn)
    stale = claim(conn, "stalled:1")
    taken_by_another_tick(conn, stale)
    before = lease_of(conn, stale.id)
    spec = registry()["test.ok"]
    keeper = LeaseKeeper({"test.ok": spec}, clock=lambda: 0.0, log=Log())
    connection = ConnectionKeeper(conn, Database(db_url), Log())
    flight = Flight(stale, spec, ctx=None)  # type: ignore[arg-type]

    assert keeper.renew(connection, [flight], now=100.0) == [flight]
    assert keeper.hand_back(connection, [flight]) == set()
    assert lease_of(conn, stale.id) == before


def test_a_stalled_tick_learns_at_its_next_heartbeat_that_another_tick_holds_its_run(
    db_url, conn, tmp_path, monkeypatch
):
    exec_log = tmp_path / "exec.log"
    monkeypatch.setenv("JOBRUNNER_TEST_EXEC_LOG", str(exec_log))
    run_id = insert_run(conn, "fault.block_first", payload={"seconds": 5})
    # A one-second lease: the tick beats every third of a second.
    stalled = Background(db_url, "fault.block_first", lease=1.0)
    wait_for(lambda: exec_log.exists(), "the handler to start")
    later = db_now(conn) + LATER
    store.runs_rescue_many(conn, now=later)
    claim(conn, "other:2", "fault.block_first", lease=3600, now=later)
    held = lease_of(conn, run_id)

    told = wait_for(lambda: _events(exec_log)[1:], "the handler to be told or to give up")
    report = stalled.join()

    assert told == ["cancelled"]
    assert report.lost == 1
    assert lease_of(conn, run_id) == held


def _events(exec_log: Any) -> list[str]:
    return [line.split()[3] for line in exec_log.read_text().splitlines()]


def test_a_tick_stopped_after_its_run_was_claimed_by_another_hands_back_nothing(
    db_url, conn, tmp_path
):
    exec_log = tmp_path / "exec.log"
    run_id = insert_run(conn, "fault.sleep", payload={"seconds": 30})
    tick_args = ["--database-url", db_url, "--handlers", "tests.handlers.faults", "--json"]
    stalled = jobrunner_process(
        "tick", *tick_args, "--grace", "0.2s", env={"JOBRUNNER_TEST_EXEC_LOG": str(exec_log)}
    )
    try:
        wait_for(lambda: exec_log.exists(), "the handler to start")
        later = db_now(conn) + LATER
        store.runs_rescue_many(conn, now=later)
        claim(conn, "other:2", "fault.sleep", lease=3600, now=later)
        held = lease_of(conn, run_id)
    finally:
        stalled.send_signal(signal.SIGTERM)
    out, err = stalled.communicate(timeout=30)

    assert stalled.returncode == 0, err[-2000:]
    assert json.loads(out)["handed_back"] == 0
    assert lease_of(conn, run_id) == held
    assert run_row(conn, run_id).locked_by == "other:2"


# -- hand-back: the status its earlier attempts left -------------------------------


@pytest.mark.parametrize(
    ("earlier_attempts", "status"),
    [(0, "queued"), (1, "failed"), (2, "failed")],
    ids=["no earlier attempt", "one failed attempt", "two failed attempts"],
)
@pytest.mark.parametrize("door", ["by run", "by claim"])
def test_a_run_handed_back_is_as_before_its_claim_due_now(conn, earlier_attempts, status, door):
    before = "failed" if earlier_attempts else "queued"
    run_id = insert_run(conn, status=before, attempts=earlier_attempts)
    held = claim(conn, "w:1")
    assert held.attempt == earlier_attempts + 1

    if door == "by run":
        assert store.runs_hand_back_many(conn, [held]) == {run_id}
    else:
        assert store.runs_hand_back_claim(conn, held.lease_token) == [run_id]

    run = run_row(conn, run_id)
    assert (run.status, run.attempts) == (status, earlier_attempts)
    assert (run.locked_by, run.locked_until, run.started_at) == (None, None, None)
    assert run.run_at <= db_now(conn)
    assert count(conn, "SELECT count(*) FROM job_attempts") == 0


# -- rescue: only what has expired ---------------------------------------------------

LEASE_LEFT = {
    "1 second": timedelta(seconds=1),
    "1 minute": timedelta(minutes=1),
    "5 minutes": timedelta(minutes=5),
    "1 hour": timedelta(hours=1),
}


@pytest.mark.parametrize("left", LEASE_LEFT.values(), ids=LEASE_LEFT.keys())
def test_a_lease_that_has_not_expired_is_never_rescued(db_url, conn, left):
    at = db_now(conn)
    run_id = insert_run(conn, status="running", locked_until=at + left)
    before = lease_of(conn, run_id)

    assert store.runs_rescue_many(conn, now=at) == []
    assert tick(db_url, now=at).rescued == 0

    assert lease_of(conn, run_id) == before
    assert count(conn, "SELECT count(*) FROM job_attempts") == 0


@pytest.mark.parametrize("door", ["store", "tick"])
def test_a_lease_expired_by_one_second_is_rescued(db_url, conn, door):
    at = db_now(conn)
    run_id = insert_run(
        conn, status="running", max_attempts=3, locked_until=at - timedelta(seconds=1)
    )

    if door == "store":
        assert store.runs_rescue_many(conn, now=at) == [run_id]
    else:
        assert tick(db_url, now=at).rescued == 1

    run = run_row(conn, run_id)
    assert (run.status, run.error_type, run.locked_by) == ("failed", "lease_expired", None)
    [lost] = store.run_attempts_get(conn, run_id)
    assert (lost.attempt, lost.error_type) == (1, "lease_expired")


# -- backoff: the handler's own ------------------------------------------------------

RUNS = 30  # the largest of this many uniform draws lies above half their range: all but surely


@pytest.mark.parametrize(
    "job_type", ["test.fail_slowly", "aio.fail_slowly"], ids=["plain", "async"]
)
def test_a_handlers_own_backoff_spaces_its_retries(db_url, conn, job_type):
    """Backoff(base=100, cap=300): retry n is due uniformly within min(300, 100·2ⁿ⁻¹) seconds.

    The default (15 s, doubling) would keep every retry within 60 s."""
    ids = insert_runs(conn, RUNS, job_type)
    at = db_now(conn)
    for attempt, ceiling in [(1, 100), (2, 200), (3, 300)]:
        report = tick(db_url, job_type, now=at)
        assert (report.claimed, report.failed) == (RUNS, RUNS)
        delays = [(run_row(conn, i).run_at - at).total_seconds() for i in ids]
        assert all(0 <= delay <= ceiling for delay in delays), (attempt, delays)
        assert max(delays) > ceiling / 2, (attempt, delays)
        at += timedelta(seconds=ceiling + 1)

    assert tick(db_url, job_type, now=at).dead == RUNS  # the fourth attempt was the last
