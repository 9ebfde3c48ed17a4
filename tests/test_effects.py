"""Exactly-once effects: the handler's transaction, the effects ledger, transactional enqueue.

Database effects are rows in `effect_rows`, written through `ctx.db`; external
effects are lines in an outbox file. Crashes are real: `jobrunner tick` processes
killed with SIGKILL at a point the handler signals. Time moves through `now=`.
"""

from __future__ import annotations

import http.server
import json
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tests.handlers.effects  # noqa: F401 - registers the effects handlers
from cronjob import store
from cronjob.api import enqueue
from cronjob.context import JobContext
from cronjob.db import Database
from cronjob.report import TickReport
from cronjob.tick.connection import ConnectionKeeper
from cronjob.tick.flight import Flight, FlightState
from cronjob.tick.leases import LeaseKeeper
from cronjob.tick.pool import Pool
from tests.conftest import ROOT, count, jobrunner_process
from tests.factories import tick
from tests.test_lifecycle import db_now, run_row

HOUR = timedelta(hours=1)


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Files:
    found = Files(tmp_path)
    monkeypatch.setenv("JOBRUNNER_TEST_EXEC_LOG", str(found.exec_log))
    return found


class Files:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.exec_log = root / "exec.log"
        self.outbox = root / "outbox"
        self.ready = root / "ready"
        self.release = root / "release"

    def pause(self) -> dict[str, str]:
        return {"ready": str(self.ready), "release": str(self.release)}

    def executions(self) -> list[tuple[int, int, int]]:
        if not self.exec_log.exists():
            return []
        return [tuple(map(int, line.split())) for line in self.exec_log.read_text().splitlines()]  # type: ignore[misc]

    def outbox_lines(self) -> list[str]:
        return self.outbox.read_text().splitlines() if self.outbox.exists() else []


def wait_for(path: Path, process: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + 15
    while not path.exists():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"tick exited early: {process.communicate()}")
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.01)


def effects(conn: psycopg.Connection[Any], key: str) -> list[tuple[int, int]]:
    return conn.execute(
        "SELECT run_id, attempt FROM effect_rows WHERE key = %s ORDER BY run_id", (key,)
    ).fetchall()


def ledger(conn: psycopg.Connection[Any]) -> list[tuple[str, int, str]]:
    return conn.execute("SELECT key, run_id, kind FROM job_effects ORDER BY key").fetchall()


class Background:
    """A library tick running on its own thread, for tests that act while a handler waits."""

    def __init__(self, db_url: str, *types: str, **options: Any) -> None:
        self.report: TickReport | None = None
        self._thread = threading.Thread(
            target=self._run, args=(db_url, types, options), daemon=True
        )
        self._thread.start()

    def _run(self, db_url: str, types: tuple[str, ...], options: dict[str, Any]) -> None:
        self.report = tick(db_url, *types, **options)

    def join(self) -> TickReport:
        self._thread.join(20)
        assert self.report is not None, "the tick did not finish"
        return self.report


def kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(10)


# -- the handler's transaction ---------------------------------------------


def test_writes_through_ctx_db_commit_with_the_runs_success(effects_db, conn, files):
    run_id = enqueue(conn, "effects.record", {"key": "invoice:7"})

    report = tick(effects_db, "effects.record")

    assert report.succeeded == 1
    assert run_row(conn, run_id).status == "succeeded"
    assert effects(conn, "invoice:7") == [(run_id, 1)]
    assert ledger(conn) == [("invoice:7", run_id, "once")]


def test_a_handler_that_writes_then_raises_leaves_no_effect_and_its_failure_is_recorded(
    effects_db, conn, files
):
    run_id = enqueue(conn, "effects.record", {"key": "invoice:7", "fail_attempts": 1})

    report = tick(effects_db, "effects.record")

    assert report.failed == 1
    run = run_row(conn, run_id)
    assert (run.status, run.error_type) == ("failed", "RuntimeError")
    assert run.last_error == "failed after writing invoice:7"
    [attempt] = store.run_attempts_get(conn, run_id)
    assert attempt.traceback and "failed after writing" in attempt.traceback
    assert effects(conn, "invoice:7") == []
    assert ledger(conn) == []

    # The retry finds the key unrecorded and does the effect, once.
    tick(effects_db, "effects.record", now=db_now(conn) + HOUR)
    assert run_row(conn, run_id).status == "succeeded"
    assert effects(conn, "invoice:7") == [(run_id, 2)]


def test_three_runs_sharing_a_business_key_make_one_effect(effects_db, conn, files):
    # Held open a moment after once(), so the three transactions overlap: the
    # later ones wait on the first's key, then see it committed.
    ids = [
        enqueue(conn, "effects.record", {"key": "weekly:1:2026-01-05", "hold": 0.3})
        for _ in range(3)
    ]

    report = tick(effects_db, "effects.record", concurrency=3)

    assert report.succeeded == 3
    assert sorted(run_id for run_id, _, _ in files.executions()) == ids
    [(winner, _)] = effects(conn, "weekly:1:2026-01-05")
    assert ledger(conn) == [("weekly:1:2026-01-05", winner, "once")]
    assert {run_row(conn, i).status for i in ids} == {"succeeded"}


def test_a_run_waiting_on_a_key_held_by_a_transaction_that_rolls_back_gets_the_key(
    effects_db, conn, files
):
    first = enqueue(conn, "effects.record", {"key": "k", "fail_attempts": 1, **files.pause()})
    holding = Background(effects_db, "effects.record")
    wait_for(files.ready)
    second = enqueue(conn, "effects.record", {"key": "k"})
    waiting = Background(effects_db, "effects.record")
    wait_until_blocked(conn)
    files.release.touch()
    holding.join()
    waiting.join()

    assert run_row(conn, first).status == "failed"
    assert run_row(conn, second).status == "succeeded"
    assert effects(conn, "k") == [(second, 1)]


def test_a_key_recorded_by_a_failed_attempt_is_free_for_the_next_run(effects_db, conn, files):
    first = enqueue(conn, "effects.record", {"key": "k", "fail_attempts": 3})
    tick(effects_db, "effects.record")
    second = enqueue(conn, "effects.record", {"key": "k"})
    tick(effects_db, "effects.record")
    assert run_row(conn, first).status == "failed"
    assert effects(conn, "k") == [(second, 1)]


def test_through_ctx_database_a_handler_sees_its_run_leased_under_ctx_lease_token(db_url, conn):
    # What an integration (Django's runner) uses to fence a write of its own to the run's row.
    from cronjob.handlers import handler, registry

    seen: list[Any] = []

    @handler("effects.own_connection")
    def own_connection(ctx: Any, payload: Any) -> None:
        with ctx.database.connect() as own:
            row = own.execute("SELECT lease_token FROM job_runs WHERE id = %s", (ctx.run_id,))
            seen.append((row.fetchone()[0], ctx.lease_token, ctx.used_db))

    try:
        enqueue(conn, "effects.own_connection")
        report = tick(db_url, "effects.own_connection")
    finally:
        registry().pop("effects.own_connection")
    [(stored, told, used_db)] = seen
    assert report.succeeded == 1
    assert stored == told and not used_db  # its own connection, not the run's transaction


def test_a_handler_that_never_touches_ctx_db_holds_no_transaction(effects_db, conn, files):
    def open_transactions() -> int:
        return count(
            conn,
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND state LIKE 'idle in transaction%%'",
        )

    enqueue(conn, "effects.idle", files.pause())
    background = Background(effects_db, "effects.idle")
    wait_for(files.ready)
    idle = open_transactions()
    files.release.touch()
    background.join()

    files.ready.unlink()
    files.release.unlink()
    enqueue(conn, "effects.record", {"key": "k", **files.pause()})
    background = Background(effects_db, "effects.record")
    wait_for(files.ready)
    writing = open_transactions()
    files.release.touch()
    background.join()

    assert (idle, writing) == (0, 1)


def test_kill_9_after_the_handler_wrote_redoes_the_run_and_the_effect_exists_once(
    effects_db, conn, files
):
    run_id = enqueue(conn, "effects.record", {"key": "invoice:7", "ready": str(files.ready)})
    process = jobrunner_process(
        "tick", "--database-url", effects_db, "--handlers", "tests.handlers.effects"
    )
    try:
        wait_for(files.ready, process)  # the handler has written through ctx.db, not committed
    finally:
        kill(process)

    run = run_row(conn, run_id)
    assert (run.status, run.attempts) == ("running", 1)
    assert effects(conn, "invoice:7") == [] and ledger(conn) == []

    report = tick(effects_db, "effects.record", now=db_now(conn) + HOUR)

    assert (report.rescued, report.succeeded) == (1, 1)
    run = run_row(conn, run_id)
    assert (run.status, run.attempts) == ("succeeded", 2)
    assert effects(conn, "invoice:7") == [(run_id, 2)]
    assert [a.error_type for a in store.run_attempts_get(conn, run_id)] == ["lease_expired"]
    assert [(r, a) for r, a, _ in files.executions()] == [(run_id, 1), (run_id, 2)]
    assert files.executions()[0][2] == process.pid


def test_kill_9_after_the_handlers_transaction_committed_leaves_nothing_to_redo(
    effects_db, conn, files
):
    # One worker runs them in order: the first run's transaction has committed
    # before the second starts, and the process is killed inside the second.
    done = enqueue(conn, "effects.record", {"key": "invoice:7"}, priority=-1)
    blocked = enqueue(conn, "effects.idle", {"ready": str(files.ready)})
    process = jobrunner_process(
        "tick",
        "--database-url",
        effects_db,
        "--handlers",
        "tests.handlers.effects",
        "--concurrency",
        "1",
        "--batch-size",
        "1",
    )
    try:
        wait_for(files.ready, process)
    finally:
        kill(process)

    assert run_row(conn, done).status == "succeeded"
    assert run_row(conn, blocked).status == "running"

    report = tick(effects_db, "effects.record", "effects.idle", now=db_now(conn) + HOUR)

    assert (report.rescued, report.claimed, report.succeeded) == (1, 1, 1)
    assert run_row(conn, done).attempts == 1
    assert run_row(conn, blocked).status == "succeeded"
    assert effects(conn, "invoice:7") == [(done, 1)]
    assert [r for r, _, _ in files.executions()].count(done) == 1


def test_losing_the_lease_while_inside_ctx_db_rolls_everything_back(effects_db, conn, files):
    run_id = enqueue(conn, "effects.record", {"key": "invoice:7", **files.pause()})
    background = Background(effects_db, "effects.record")
    wait_for(files.ready)

    # The lease expires (the tick stalled) and another tick re-claims the run.
    later = db_now(conn) + HOUR
    assert store.runs_rescue_many(conn, now=later) == [run_id]
    [stolen] = store.runs_claim_many(
        conn,
        job_types=["effects.record"],
        leases=[60],
        max_attempts=[3],
        limit=1,
        worker="thief:1",
        now=later,
    )
    files.release.touch()
    report = background.join()

    assert (report.succeeded, report.lost) == (0, 1)
    run = run_row(conn, run_id)
    assert (run.status, run.locked_by, run.attempts) == ("running", "thief:1", 2)
    assert effects(conn, "invoice:7") == [] and ledger(conn) == []

    # The thief's claim expires too; the next attempt does the effect, once.
    tick(effects_db, "effects.record", now=later + HOUR)
    assert run_row(conn, run_id).status == "succeeded"
    assert effects(conn, "invoice:7") == [(run_id, 3)]
    assert stolen.attempt == 2


def test_cancelling_a_run_while_inside_ctx_db_rolls_its_writes_back(effects_db, conn, files):
    run_id = enqueue(
        conn, "effects.record", {"key": "invoice:7", "enqueue": "follow-up", **files.pause()}
    )
    background = Background(effects_db, "effects.record")
    wait_for(files.ready)
    store.runs_cancel_many(conn, [run_id])
    files.release.touch()
    report = background.join()

    assert report.lost == 1
    assert run_row(conn, run_id).status == "cancelled"
    assert effects(conn, "invoice:7") == [] and ledger(conn) == []
    assert count(conn, "SELECT count(*) FROM job_runs") == 1  # the follow-up went too


def test_a_heartbeat_that_misses_a_run_being_committed_does_not_call_it_lost(effects_db, conn):
    # The handler's transaction has just committed "succeeded" when the main thread
    # heartbeats, before it has collected the result: the lease no longer renews,
    # but the run is not given up; its handler's commit is what happened to it.
    from cronjob import transitions
    from cronjob.handlers import registry

    enqueue(conn, "effects.record", {"key": "k"})
    [run] = store.runs_claim_many(
        conn, job_types=["effects.record"], leases=[60], max_attempts=[3], limit=1, worker="w:1"
    )
    store.runs_finalize_many(conn, [transitions.succeeded(run)], worker="w:1")
    specs = {"effects.record": registry()["effects.record"]}
    database = Database(effects_db)
    pool = Pool(specs, concurrency=1, database=database, worker="w:1")
    # DONE: the handler returned and its worker is committing the outcome.
    flight = Flight(run, specs["effects.record"], JobContext(run, database), state=FlightState.DONE)
    pool.flights[run.id] = flight

    leases = LeaseKeeper(specs)
    missed = leases.renew(ConnectionKeeper(conn, database, log=None), [flight], 0.0)
    assert missed == [flight]
    assert not pool.settle(flight)
    assert (flight.state, flight.ctx.cancelled.is_set(), run.id in pool.flights) == (
        FlightState.DONE,
        False,
        True,
    )

    flight.state = FlightState.STARTED  # still running: a missed beat means the lease is lost
    assert pool.settle(flight)
    assert (flight.state, flight.ctx.cancelled.is_set(), run.id in pool.flights) == (
        FlightState.SETTLED,
        True,
        False,
    )


def test_a_heartbeat_blocked_by_a_row_lock_is_skipped_and_the_tick_goes_on(
    effects_db, conn, files, capsys
):
    # A handler that locks job_runs rows in ctx.db (here: the test) can make a
    # heartbeat wait; after lock_timeout the beat is skipped, not the tick.
    run_id = enqueue(conn, "effects.idle", files.pause())
    background = Background(effects_db, "effects.idle", lease=1.5)
    wait_for(files.ready)
    logged = ""
    with psycopg.connect(effects_db) as locker:
        locker.execute("SELECT 1 FROM job_runs WHERE id = %s FOR UPDATE", (run_id,))
        deadline = time.monotonic() + 15
        while "heartbeat skipped" not in logged:
            assert time.monotonic() < deadline, "the heartbeat never gave up"
            time.sleep(0.1)
            logged += capsys.readouterr().err
        locker.rollback()
    files.release.touch()
    report = background.join()

    assert (report.succeeded, report.lost) == (1, 0)
    assert run_row(conn, run_id).status == "succeeded"


@pytest.mark.parametrize(
    ("ending", "message"),
    [
        ("commit", "committed or rolled back ctx.db itself"),
        ("rollback", "committed or rolled back ctx.db itself"),
        ("close", "closed ctx.db"),
        ("swallow_error", "transaction is aborted"),
    ],
)
def test_a_handler_that_ends_its_transaction_itself_fails_the_attempt(
    effects_db, conn, files, ending, message
):
    run_id = enqueue(conn, "effects.record", {"key": "k", "end_transaction": ending})
    report = tick(effects_db, "effects.record")
    run = run_row(conn, run_id)
    assert report.failed == 1
    assert (run.status, run.error_type) == ("failed", "cronjob.context.HandlerTransactionError")
    assert message in run.last_error


def test_a_statement_that_fails_inside_a_savepoint_does_not_spoil_the_transaction(
    effects_db, conn, files
):
    run_id = enqueue(conn, "effects.record", {"key": "k", "end_transaction": "savepoint"})
    tick(effects_db, "effects.record")
    assert run_row(conn, run_id).status == "succeeded"
    assert effects(conn, "k") == [(run_id, 1)]


def test_ctx_db_has_the_runners_limits_and_a_handler_may_raise_them_for_its_transaction(
    effects_db, conn
):
    enqueue(conn, "effects.settings", {})
    enqueue(conn, "effects.settings", {"statement_timeout": "10min"})
    tick(effects_db, "effects.settings", concurrency=1)
    rows = conn.execute("SELECT run_id, key FROM effect_rows ORDER BY run_id, key").fetchall()
    assert [key for _, key in rows] == [
        "lock_timeout=5s",
        "statement_timeout=30s",
        "lock_timeout=5s",
        "statement_timeout=10min",
    ]


def test_the_runners_own_statements_in_ctx_db_run_under_the_runners_limits(effects_db, conn):
    enqueue(conn, "effects.record", {"key": "k"})
    [run] = store.runs_claim_many(
        conn, job_types=["effects.record"], leases=[60], max_attempts=[3], limit=1, worker="w:1"
    )
    ctx = JobContext(run, Database(effects_db))
    try:
        ctx.db.execute("SET LOCAL statement_timeout = '10min'; SET lock_timeout = 0")
        runner = ctx.handler_transaction()
        limits = [
            runner.execute(f"SHOW {name}").fetchone()[0]
            for name in ("statement_timeout", "lock_timeout")
        ]
    finally:
        ctx.close()
    assert limits == ["30s", "5s"]


class Unconnected(Database):
    def connect(self, *, autocommit: bool = True) -> Any:
        pytest.fail("no connection needed")


def unconnected_context() -> JobContext:
    from cronjob.models import ClaimedRun

    run = ClaimedRun(1, "t", {}, None, None, 1, False, None)  # type: ignore[arg-type]
    return JobContext(run, Unconnected("postgresql:///never-connected"))


def test_effect_keys_are_checked():
    ctx = unconnected_context()
    for bad in ("", "a\x00b", "é" * 501, 7):
        with pytest.raises(ValueError):
            ctx.once(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            ctx.at_most_once(bad)  # type: ignore[arg-type]


def test_a_run_that_was_cancelled_or_lost_its_lease_records_no_more_keys():
    from cronjob.context import LeaseLost

    ctx = unconnected_context()
    ctx.cancelled.set()
    with pytest.raises(LeaseLost):
        ctx.once("k")
    with pytest.raises(LeaseLost):
        ctx.at_most_once("k")


# -- at most once, for effects outside the database --------------------------


# The query docs/explanation/exactly-once.md gives for effects that may not have happened.
MAYBE_MISSING = (
    "SELECT e.key, e.run_id, e.attempt FROM job_effects e JOIN job_attempts a ON"
    " (a.run_id, a.attempt) = (e.run_id, e.attempt) WHERE e.kind = 'at_most_once'"
)


def test_at_most_once_commits_its_record_before_the_effect(effects_db, conn, files):
    run_id = enqueue(
        conn, "effects.notify", {"key": "mail:7", "outbox": str(files.outbox), **files.pause()}
    )
    background = Background(effects_db, "effects.notify")
    wait_for(files.ready)
    visible_before_the_effect = ledger(conn)
    files.release.touch()
    background.join()

    assert visible_before_the_effect == [("mail:7", run_id, "at_most_once")]
    assert files.outbox_lines() == [f"mail:7 {run_id}"]


def test_at_most_once_never_repeats_an_effect_even_when_the_run_fails_after_it(
    effects_db, conn, files
):
    first = enqueue(conn, "effects.notify", {"key": "mail:7", "outbox": str(files.outbox)})
    second = enqueue(conn, "effects.notify", {"key": "mail:7", "outbox": str(files.outbox)})
    tick(effects_db, "effects.notify", concurrency=1)
    assert files.outbox_lines() == [f"mail:7 {first}"]
    assert run_row(conn, second).status == "succeeded"

    # The mail server hangs up after the record: the retry does not send again.
    enqueue(
        conn, "effects.notify", {"key": "mail:8", "outbox": str(files.outbox), "fail_attempts": 1}
    )
    tick(effects_db, "effects.notify")
    tick(effects_db, "effects.notify", now=db_now(conn) + HOUR)
    assert files.outbox_lines() == [f"mail:7 {first}"]
    assert [k for k, _, _ in ledger(conn)] == ["mail:7", "mail:8"]
    assert [key for key, _, _ in conn.execute(MAYBE_MISSING)] == ["mail:8"]


def test_kill_9_between_at_most_once_and_the_effect_means_the_effect_never_happens(
    effects_db, conn, files
):
    run_id = enqueue(
        conn,
        "effects.notify",
        {"key": "mail:7", "outbox": str(files.outbox), "ready": str(files.ready)},
    )
    process = jobrunner_process(
        "tick", "--database-url", effects_db, "--handlers", "tests.handlers.effects"
    )
    try:
        wait_for(files.ready, process)
    finally:
        kill(process)

    report = tick(effects_db, "effects.notify", now=db_now(conn) + HOUR)

    assert report.succeeded == 1
    assert run_row(conn, run_id).attempts == 2
    assert files.outbox_lines() == []  # at most once: here, never
    # The record shows what may not have happened: an at-most-once key written
    # by an attempt that failed. The query is the one the docs give.
    assert ledger(conn) == [("mail:7", run_id, "at_most_once")]
    assert conn.execute(MAYBE_MISSING).fetchall() == [("mail:7", run_id, 1)]


def test_at_most_once_refuses_to_record_for_a_run_that_lost_its_lease(effects_db, conn, files):
    run_id = enqueue(
        conn,
        "effects.notify",
        {
            "key": "mail:7",
            "outbox": str(files.outbox),
            "pause_before_record": True,
            **files.pause(),
        },
    )
    background = Background(effects_db, "effects.notify")
    wait_for(files.ready)
    later = db_now(conn) + HOUR
    store.runs_rescue_many(conn, now=later)
    store.runs_claim_many(
        conn,
        job_types=["effects.notify"],
        leases=[60],
        max_attempts=[3],
        limit=1,
        worker="thief:1",
        now=later,
    )
    files.release.touch()
    report = background.join()

    assert report.lost == 1
    assert ledger(conn) == [] and files.outbox_lines() == []
    assert run_row(conn, run_id).locked_by == "thief:1"


# -- transactional enqueue -------------------------------------------------------


def test_a_rolled_back_enqueue_leaves_no_job_and_its_key_stays_free(db_url, conn):
    with psycopg.connect(db_url) as app:
        with pytest.raises(ZeroDivisionError), app.transaction():
            enqueue(app, "test.ok", {"v": 1}, idempotency_key="order:42")
            raise ZeroDivisionError
        assert count(conn, "SELECT count(*) FROM job_runs") == 0

        with app.transaction():
            run_id = enqueue(app, "test.ok", {"v": 2}, idempotency_key="order:42")
    assert run_row(conn, run_id).payload == {"v": 2}
    assert run_id == enqueue(conn, "test.ok", {"v": 3}, idempotency_key="order:42")
    assert count(conn, "SELECT count(*) FROM job_runs") == 1


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_an_enqueue_waiting_on_the_same_key_follows_the_first_transactions_fate(
    db_url, conn, first_ends
):
    with psycopg.connect(db_url) as first, psycopg.connect(db_url) as second:
        first_id = enqueue(first, "test.ok", {"by": "first"}, idempotency_key="order:42")
        result: list[int] = []
        waiter = threading.Thread(
            target=lambda: result.append(
                enqueue(second, "test.ok", {"by": "second"}, idempotency_key="order:42")
            )
        )
        waiter.start()
        wait_until_blocked(conn)
        getattr(first, first_ends)()
        waiter.join(10)
        second.commit()

    [second_id] = result
    rows = conn.execute("SELECT id, payload->>'by' FROM job_runs").fetchall()
    if first_ends == "commit":
        assert second_id == first_id and rows == [(first_id, "first")]
    else:
        assert second_id != first_id and rows == [(second_id, "second")]


def wait_until_blocked(conn: psycopg.Connection[Any]) -> None:
    deadline = time.monotonic() + 10
    while not count(
        conn,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'",
    ):
        assert time.monotonic() < deadline, "the second enqueue never waited"
        time.sleep(0.01)


def test_a_job_enqueued_through_ctx_db_exists_only_if_the_run_succeeds(effects_db, conn, files):
    failing = enqueue(
        conn, "effects.record", {"key": "a", "enqueue": "after:a", "fail_attempts": 3}
    )
    ok = enqueue(conn, "effects.record", {"key": "b", "enqueue": "after:b"})
    tick(effects_db, "effects.record")
    keys = [r[0] for r in conn.execute("SELECT idempotency_key FROM job_runs WHERE id > %s", (ok,))]
    assert keys == ["after:b"]
    assert run_row(conn, failing).status == "failed"


# -- retention -----------------------------------------------------------------


def test_prune_deletes_keys_whose_run_is_gone_in_batches(effects_db, conn, files):
    kept_run = enqueue(conn, "effects.record", {"key": "alive"})
    gone_runs = [enqueue(conn, "effects.record", {"key": f"gone:{i}"}) for i in range(5)]
    tick(effects_db, "effects.record")
    conn.execute("INSERT INTO job_effects (key, run_id) VALUES ('no-run', NULL)")
    conn.execute("DELETE FROM job_runs WHERE id = ANY(%s)", (gone_runs,))

    deleted = store.effects_prune_many(conn, older_than_seconds=0, batch_size=2)

    assert deleted == 6
    assert [k for k, _, _ in ledger(conn)] == ["alive"]
    assert run_row(conn, kept_run).status == "succeeded"


def test_prune_keeps_a_key_whose_run_still_exists_however_old(effects_db, conn, files):
    # The notice's run failed after recording its key and will be retried:
    # forgetting the key now would let the retry send it.
    retrying = enqueue(
        conn, "effects.notify", {"key": "mail:7", "outbox": str(files.outbox), "fail_attempts": 1}
    )
    enqueue(conn, "effects.record", {"key": "invoice:7"})
    tick(effects_db, "effects.notify", "effects.record")
    assert run_row(conn, retrying).status == "failed"

    years_later = db_now(conn) + timedelta(days=3650)
    deleted = store.effects_prune_many(conn, older_than_seconds=0, batch_size=100, now=years_later)
    assert deleted == 0
    assert [k for k, _, _ in ledger(conn)] == ["invoice:7", "mail:7"]


def test_prune_can_keep_keys_longer_than_their_runs(effects_db, conn, files):
    old = enqueue(conn, "effects.record", {"key": "old"})
    tick(effects_db, "effects.record")
    conn.execute("UPDATE job_effects SET created_at = now() - interval '100 days'")
    new = enqueue(conn, "effects.record", {"key": "new"})
    tick(effects_db, "effects.record")
    conn.execute("DELETE FROM job_runs WHERE id IN (%s, %s)", (old, new))

    deleted = store.effects_prune_many(conn, older_than_seconds=90 * 86400, batch_size=100)

    assert deleted == 1
    assert [k for k, _, _ in ledger(conn)] == ["new"]
    # A key that was forgotten is new again.
    again = enqueue(conn, "effects.record", {"key": "old"})
    tick(effects_db, "effects.record")
    assert effects(conn, "old") == [(old, 1), (again, 1)]


# -- the example of docs/explanation/exactly-once.md --------------------------------

EXAMPLE = ROOT / "tests" / "handlers" / "weekly_report.py"


def example_code() -> str:
    text = EXAMPLE.read_text()
    match = re.search(r"# docs example begins\n(.*?)\n*# docs example ends", text, re.S)
    assert match
    return match.group(1).strip() + "\n"


def test_the_docs_show_the_tested_weekly_report_example():
    page = (ROOT / "docs" / "explanation" / "exactly-once.md").read_text()
    assert f"```python\n{example_code()}```" in page
    assert MAYBE_MISSING in " ".join(page.split())


class Webhook(http.server.BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    received: list[dict[str, Any]] = []
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), type("Recorder", (Webhook,), {"received": received})
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("REPORT_WEBHOOK_URL", f"http://127.0.0.1:{server.server_port}/reports")
    yield received
    server.shutdown()
    server.server_close()


def test_the_weekly_report_example_makes_one_report_and_one_notice_per_user_and_week(
    db_url, conn, webhook
):
    import tests.handlers.weekly_report  # noqa: F401 - the example's handlers, in this process

    conn.execute(
        "CREATE TABLE IF NOT EXISTS orders"
        " (user_id bigint NOT NULL, amount_cents bigint NOT NULL, placed_at timestamptz NOT NULL)"
    )
    conn.execute(
        "CREATE TABLE IF NOT EXISTS weekly_reports"
        " (user_id bigint NOT NULL, week_start date NOT NULL, total_cents bigint NOT NULL)"
    )
    # The first report insert fails (a sequence is not rolled back), so one run
    # fails after recording its key and is retried.
    conn.execute("DROP SEQUENCE IF EXISTS weekly_reports_flaky")
    conn.execute("CREATE SEQUENCE weekly_reports_flaky")
    conn.execute(
        "CREATE OR REPLACE FUNCTION weekly_reports_flaky() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN IF nextval('weekly_reports_flaky') = 1 THEN"
        " RAISE EXCEPTION 'disk hiccup'; END IF; RETURN NEW; END$$"
    )
    conn.execute("DROP TRIGGER IF EXISTS weekly_reports_flaky ON weekly_reports")
    conn.execute(
        "CREATE TRIGGER weekly_reports_flaky BEFORE INSERT ON weekly_reports"
        " FOR EACH ROW EXECUTE FUNCTION weekly_reports_flaky()"
    )
    conn.execute(
        "INSERT INTO orders VALUES (1, 1000, '2026-01-05 10:00Z'), (1, 250, '2026-01-11 23:00Z'),"
        " (1, 999, '2026-01-12 00:00Z'), (2, 4200, '2026-01-07 12:00Z')"
    )
    week = {"week_start": "2026-01-05"}
    # The schedule's run, and two more for user 1: a manual re-run, a duplicate enqueue.
    for user_id in (1, 1, 2, 1):
        enqueue(conn, "weekly_report.build", {"user_id": user_id, **week})

    process = jobrunner_process(
        "tick",
        "--database-url",
        db_url,
        "--handlers",
        "tests.handlers.weekly_report",
        "--json",
    )
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert json.loads(out)["failed"] == 1
    tick(db_url, "weekly_report.build", "weekly_report.notify", now=db_now(conn) + HOUR)

    reports = conn.execute(
        "SELECT user_id, week_start::text, total_cents FROM weekly_reports ORDER BY user_id"
    ).fetchall()
    assert reports == [(1, "2026-01-05", 1250), (2, "2026-01-05", 4200)]
    assert sorted((n["user_id"], n["week_start"], n["total_cents"]) for n in webhook) == [
        (1, "2026-01-05", 1250),
        (2, "2026-01-05", 4200),
    ]
    runs = conn.execute("SELECT job_type, status, attempts FROM job_runs").fetchall()
    assert {(t, s) for t, s, _ in runs} == {
        ("weekly_report.build", "succeeded"),
        ("weekly_report.notify", "succeeded"),
    }
    assert sorted(a for t, _, a in runs if t == "weekly_report.build") == [1, 1, 1, 2]
    assert [t for t, _, _ in runs].count("weekly_report.notify") == 2
