"""The orchestrator's own fault handling, driven through the library on a real
database: leases, stopping, and a connection that goes away under the tick."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

import tests.handlers.faults  # noqa: F401 - registers the fault handlers
from cronjob import store
from cronjob.api import enqueue
from cronjob.db import Database, connect
from cronjob.errors import ConnectionLost, DatabaseRefused, DatabaseUnavailable
from cronjob.handlers import handler, registry
from cronjob.tick.connection import ConnectionKeeper, Failure, StatementFailed
from tests.conftest import count, wait_for
from tests.factories import tick
from tests.test_effects import Background
from tests.test_lifecycle import db_now


def _locked_for(conn: psycopg.Connection[Any], run_id: int) -> float:
    return conn.execute(
        "SELECT extract(epoch FROM locked_until - started_at) FROM job_runs WHERE id = %s",
        (run_id,),
    ).fetchone()[0]


def test_a_run_is_leased_for_its_handlers_lease_unless_the_tick_overrides_it(db_url, conn):
    seen: dict[str, float] = {}

    @handler("lease.probe", lease="7m")
    def probe(ctx: Any, payload: Any) -> None:
        with psycopg.connect(db_url, autocommit=True) as c:
            seen[payload["as"]] = _locked_for(c, ctx.run_id)

    try:
        enqueue(conn, "lease.probe", {"as": "own"})
        tick(db_url, "lease.probe")
        enqueue(conn, "lease.probe", {"as": "overridden"})
        tick(db_url, "lease.probe", lease=45.0)
    finally:
        registry().pop("lease.probe")
    assert seen == {"own": 420.0, "overridden": 45.0}


# A deadline far past the tick's first claim, however slow the machine: the runs it finds
# held are those of that claim.
MAX_RUNTIME = 2.0


def _handed_back(conn: psycopg.Connection[Any], run_id: int) -> bool:
    """The run was claimed, then went back untouched."""
    return count(
        conn,
        "SELECT count(*) FROM job_runs WHERE id = %s AND status = 'queued'"
        " AND started_at IS NULL AND updated_at > created_at",
        run_id,
    )


def test_max_runtime_hands_back_runs_no_worker_has_started(db_url, conn, tmp_path, monkeypatch):
    # The first run's handler holds until the run claimed behind it went back at the
    # deadline: what the deadline finds does not depend on how long a handler takes.
    exec_log, release = tmp_path / "exec.log", tmp_path / "release"
    monkeypatch.setenv("JOBRUNNER_TEST_EXEC_LOG", str(exec_log))
    ids = [enqueue(conn, "fault.gated", {"release": str(release)}) for _ in range(3)]
    ticking = Background(db_url, "fault.gated", concurrency=1, max_runtime=MAX_RUNTIME, grace=30)
    wait_for(lambda: exec_log.exists(), "the first handler to start")
    wait_for(lambda: _handed_back(conn, ids[1]), "the run waiting for the worker to go back")
    release.touch()
    report = ticking.join()

    assert report.stopped_by == "max-runtime"
    # One started; the one claimed to wait for the worker goes back untouched,
    # and the last was never claimed.
    assert (report.succeeded, report.handed_back) == (1, 1)
    [first] = [i for i in ids if store.run_get(conn, i).status == "succeeded"]
    assert first not in report.handed_back_ids
    for run_id in set(ids) - {first}:
        run = store.run_get(conn, run_id)
        assert (run.status, run.attempts, run.started_at) == ("queued", 0, None)


def test_the_summary_says_what_was_handed_back_and_why(db_url, conn):
    ids = [enqueue(conn, "fault.sleep", {"seconds": 30}) for _ in range(2)]
    report = tick(db_url, "fault.sleep", concurrency=1, max_runtime=MAX_RUNTIME, grace=0.2)
    summary = report.summary()
    assert summary["stopped_by"] == "max-runtime"
    assert summary["handed_back"] == 2 and sorted(summary["handed_back_ids"]) == ids


def _terminate(db_url: str, application_name: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            (application_name,),
        )


def _tick_on(db_url: str, job_type: str, database: Database) -> Any:
    """A tick on a connection of its own, which `_terminate` can find and kill."""
    conn = connect(db_url, application_name="jobrunner-under-test")
    try:
        return tick(db_url, job_type, database=database, conn=conn)
    finally:
        conn.close()


def test_a_tick_whose_connection_is_killed_reconnects_and_records_the_outcome(db_url, conn):
    ran = threading.Event()

    @handler("conn.victim")
    def victim(ctx: Any, payload: Any) -> None:
        _terminate(db_url, "jobrunner-under-test")
        ran.set()

    try:
        run_id = enqueue(conn, "conn.victim")
        later = enqueue(conn, "conn.victim")
        report = _tick_on(db_url, "conn.victim", Database(db_url))
    finally:
        registry().pop("conn.victim")
    assert ran.is_set()
    assert report.stopped_by == "database error"
    assert store.run_get(conn, run_id).status == "succeeded"
    # Claiming stopped: the other run either ran alongside and was recorded too,
    # or had not started and went back.
    assert store.run_get(conn, later).status in {"succeeded", "queued"}
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'running'") == 0


def test_a_tick_that_cannot_reconnect_raises_connection_lost_with_its_report(
    db_url, conn, monkeypatch
):
    monkeypatch.setattr("cronjob.tick.connection.RECONNECT_PAUSES", (0.0, 0.0))

    @handler("conn.victim")
    def victim(ctx: Any, payload: Any) -> None:
        _terminate(db_url, "jobrunner-under-test")

    class Refusing(Database):
        def connect(self, *, autocommit: bool = True) -> Any:
            raise DatabaseUnavailable("cannot connect to the database: the test says no")

    try:
        run_id = enqueue(conn, "conn.victim")
        with pytest.raises(ConnectionLost) as lost:
            _tick_on(db_url, "conn.victim", Refusing(db_url))
    finally:
        registry().pop("conn.victim")
    assert "could not reconnect" in str(lost.value)
    assert "1 run(s) not finalized" in str(lost.value)
    assert lost.value.report.unrecorded == 1
    assert store.run_get(conn, run_id).status == "running"  # until its lease expires
    assert tick(db_url, "fault.work", now=db_now(conn) + timedelta(minutes=3)).rescued == 1


def test_a_claim_whose_commit_landed_but_whose_answer_was_lost_hands_its_runs_back_uncharged(
    db_url, conn, monkeypatch
):
    # The claim commits, then the connection dies before its answer arrives (a
    # failover or a restart at that instant): the tick never learns which runs it
    # holds. It chose the lease token, so after reconnecting it finds them by it.
    from cronjob import store as the_store

    claim = the_store.runs_finalize_and_claim_many
    answered: list[Any] = []

    def claim_then_lose_the_answer(claim_conn: Any, *args: Any, **kwargs: Any) -> Any:
        result = claim(claim_conn, *args, **kwargs)
        if not answered:
            answered.append(result)
            claim_conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return result

    monkeypatch.setattr(the_store, "runs_finalize_and_claim_many", claim_then_lose_the_answer)
    run_id = enqueue(conn, "test.ok", {"n": 1}, max_attempts=1)

    report = tick(db_url, "test.ok")

    [(_kept, [claimed])] = answered
    assert claimed.id == run_id  # the claim did commit
    assert report.stopped_by == "database error"
    assert (report.handed_back, report.handed_back_ids, report.unrecorded) == (1, [run_id], 0)
    run = store.run_get(conn, run_id)
    assert (run.status, run.attempts, run.locked_by) == ("queued", 0, None)

    monkeypatch.undo()
    assert tick(db_url, "test.ok").succeeded == 1
    run = store.run_get(conn, run_id)
    assert (run.status, run.attempts) == ("succeeded", 1)


def _lose_the_answer(
    monkeypatch: pytest.MonkeyPatch, when: Callable[[list[Any], list[Any]], bool]
) -> list[Any]:
    """The first claim whose decisions and runs meet `when` commits, then its connection dies
    before the answer arrives; returns [the decisions it carried] once that has happened."""
    from cronjob import store as the_store

    claim = the_store.runs_finalize_and_claim_many
    lost: list[Any] = []

    def claim_and_lose_the_answer(c: Any, *a: Any, **kw: Any) -> Any:
        kept, runs = claim(c, *a, **kw)
        if not lost and when(kw["decisions"], runs):
            lost.append(kw["decisions"])
            c.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return kept, runs

    monkeypatch.setattr(the_store, "runs_finalize_and_claim_many", claim_and_lose_the_answer)
    return lost


def test_decisions_carried_by_a_claim_whose_answer_was_lost_are_counted_as_written(
    db_url, conn, monkeypatch
):
    lost = _lose_the_answer(monkeypatch, lambda decisions, runs: bool(decisions))
    ids = [enqueue(conn, "test.ok", {"n": n}) for n in range(3)]

    report = tick(db_url, "test.ok", concurrency=1, batch_size=1)

    [[carried]] = lost
    statuses = {i: store.run_get(conn, i).status for i in ids}
    assert statuses[carried.run.id] == "succeeded"  # written by the lost claim's commit
    assert report.lost == 0  # and counted so, not as a lease lost
    assert report.succeeded == sum(s == "succeeded" for s in statuses.values())
    assert report.handed_back == 1 and set(statuses.values()) == {"succeeded", "queued"}


def test_decisions_carried_by_a_lost_claim_of_an_empty_queue_are_counted_as_written(
    db_url, conn, monkeypatch
):
    # The claim that carries the last outcome finds the queue empty, so no run is found
    # under its token: the run the outcome wrote is what shows that the commit landed.
    lost = _lose_the_answer(monkeypatch, lambda decisions, runs: bool(decisions) and not runs)
    # One run each for two claims of one; the third claim carries the first outcome.
    ids = [enqueue(conn, "test.ok", {"n": n}) for n in range(2)]

    report = tick(db_url, "test.ok", concurrency=1, batch_size=1)

    [[carried]] = lost
    statuses = {i: store.run_get(conn, i).status for i in ids}
    assert statuses[carried.run.id] == "succeeded"
    assert report.lost == 0  # counted as written, not as a lease lost
    assert report.succeeded == sum(s == "succeeded" for s in statuses.values())
    assert set(statuses.values()) <= {"succeeded", "queued"}


def test_what_a_lost_claim_wrote_is_told_apart_from_what_happened_to_its_runs_since(db_url, conn):
    from cronjob import transitions
    from cronjob.handlers import Backoff
    from cronjob.models import Errored

    ids = [enqueue(conn, "test.ok", max_attempts=3) for _ in range(5)]
    held = store.runs_claim_many(
        conn, job_types=["test.ok"], leases=[60], max_attempts=[3], limit=5, worker="w:1"
    )
    wrote, elsewhere, rescued, cancelled, never = held
    failing = Errored("ValueError", "no", retry_delay=0.0)
    decisions = [
        transitions.succeeded(wrote),
        transitions.succeeded(elsewhere),
        transitions.decide(rescued, failing, Backoff()),
        transitions.decide(cancelled, failing, Backoff()),
        transitions.succeeded(never),
    ]
    store.runs_finalize_many(conn, decisions[:1], worker="w:1")
    # The others changed otherwise: succeeded under another tick, its lease expired and
    # rescued, cancelled; the last is still running, as if the write never happened.
    conn.execute(
        "UPDATE job_runs SET status = 'succeeded', finished_at = now(), finished_by ="
        " 'w:2', locked_by = NULL, locked_until = NULL, lease_token = NULL"
        " WHERE id = %s",
        (elsewhere.id,),
    )
    store.runs_rescue_many(conn, now=db_now(conn) + timedelta(minutes=2))
    store.runs_cancel_many(conn, [cancelled.id])
    conn.execute(
        "UPDATE job_runs SET status = 'running', locked_until = now() + interval '1h',"
        " lease_token = gen_random_uuid(), finished_at = NULL WHERE id = %s",
        (never.id,),
    )

    assert store.runs_list_decided(conn, decisions, worker="w:1") == {ids[0]}


def _read_only(_conn: Any) -> None:
    raise psycopg.errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction")


class Log:
    def __init__(self) -> None:
        self.events: list[str] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.events.append(event)


def test_a_server_turned_read_only_sends_the_keeper_to_a_fresh_connection_that_takes_writes(
    db_url,
):
    # As through a multi-host URL with target_session_attrs=read-write after a failover:
    # the fresh connection reaches the server that took over.
    stale = connect(db_url)
    log = Log()
    keeper = ConnectionKeeper(stale, Database(db_url), log)
    with pytest.raises(StatementFailed) as failed:
        keeper.run("finalize", _read_only)
    assert failed.value.failure is Failure.MOVED and failed.value.retryable
    assert keeper.conn is not stale and stale.closed
    assert log.events == ["database error", "reconnected to a server that takes writes"]
    assert keeper.run("finalize", lambda conn: conn.execute("SELECT 1").fetchone()) == (1,)
    keeper.conn.close()


def test_a_server_turned_read_only_with_no_other_to_go_to_refuses_the_statement(db_url):
    read_only = conninfo.make_conninfo(db_url, options="-c default_transaction_read_only=on")
    with connect(db_url) as conn:
        keeper = ConnectionKeeper(conn, Database(read_only), Log())
        with pytest.raises(StatementFailed) as failed:
            keeper.run("finalize", _read_only)
        assert failed.value.failure is Failure.REFUSED and not failed.value.retryable
        assert keeper.conn is conn and not conn.closed


def test_a_statement_rejected_for_its_rows_refuses_nothing_else_of_the_tick(db_url):
    # A row that breaks a constraint of job_runs: the server answers, and takes the next
    # statement on the same connection.
    with connect(db_url) as conn:
        keeper = ConnectionKeeper(conn, Database(db_url), Log())
        with pytest.raises(StatementFailed) as failed:
            keeper.run(
                "claim",
                lambda c: c.execute("INSERT INTO job_runs (job_type, status) VALUES ('x', 'odd')"),
            )
        assert failed.value.failure is Failure.REJECTED
        assert not failed.value.retryable and not failed.value.refuses_the_tick
        assert keeper.run("finalize", lambda c: c.execute("SELECT 1").fetchone()) == (1,)


def test_a_tick_the_database_refuses_stops_at_once_and_says_what_became_of_its_runs(db_url, conn):
    # The claim is refused: the runs it would have taken stay queued, untouched.
    @handler("refused.probe")
    def probe(ctx: Any, payload: Any) -> None:
        raise AssertionError("nothing is claimed")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise psycopg.errors.InsufficientPrivilege("permission denied for table job_runs")

    try:
        run_id = enqueue(conn, "refused.probe")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(store, "runs_finalize_and_claim_many", refuse)
            with pytest.raises(DatabaseRefused) as refused:
                tick(db_url, "refused.probe")
    finally:
        registry().pop("refused.probe")
    assert str(refused.value) == (
        "the database refused the tick's claim: permission denied for table job_runs"
    )
    assert refused.value.report.stopped_by == "database error"
    assert store.run_get(conn, run_id).status == "queued"
