"""`jobrunner wait` and `cronjob.wait()`: they return as soon as the runs named finish, told
by the finalize's notification, with the exit codes the command line promises.

A test waits until the waiter holds the advisory lock that asks finalizes to notify
(migration 0027) before it finishes the runs, so the waiter is surely waiting by then; the
bound on how soon it returns only keeps a hung test from hanging (typical figures are
milliseconds).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import psycopg
import pytest

import tests.handlers.basic  # noqa: F401 - registers test.ok for the ticks run in-process
from cronjob import wait, wait_async
from cronjob.errors import BadInput, RunNotFound, WaitTimedOut
from tests import factories
from tests.conftest import jobrunner_process, run_cli, wait_for
from tests.factories import insert_run
from tests.test_listen import AWAITING_FINISHES, holders

SOON = 1.0  # seconds: "within a second of the finish"


def waiting(conn: psycopg.Connection, process=None) -> None:
    def holds() -> bool:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"wait ended: {process.communicate()}")
        return bool(holders(conn, AWAITING_FINISHES))

    wait_for(holds, "the waiter to wait")


def test_wait_returns_within_a_second_of_the_finish_and_exits_0(db_url, conn):
    run_id = insert_run(conn, "test.ok")
    waiter = jobrunner_process("wait", str(run_id), "--database-url", db_url)
    waiting(conn, waiter)
    assert factories.tick(db_url, "test.ok").succeeded == 1
    finished = time.monotonic()
    out, err = waiter.communicate(timeout=60)
    assert time.monotonic() - finished < SOON
    assert waiter.returncode == 0, err
    assert out.splitlines() == [f"{run_id} succeeded"]


def test_wait_returns_soon_after_a_finish_whose_transaction_began_before_it_waited(db_url, conn):
    # The cancel finds nobody waiting, so it sends nothing; the waiter finds its transaction
    # open, and asks again until it has ended, then reads once more.
    run_id = insert_run(conn, "test.ok")
    with psycopg.connect(db_url) as operator:
        operator.execute(
            "UPDATE job_runs SET status = 'cancelled', finished_at = now() WHERE id = %s",
            [run_id],
        )
        waiter = jobrunner_process("wait", str(run_id), "--database-url", db_url)
        waiting(conn, waiter)
        operator.commit()
        committed = time.monotonic()
    out, err = waiter.communicate(timeout=60)
    assert time.monotonic() - committed < SOON
    assert (waiter.returncode, out) == (1, f"{run_id} cancelled\n"), err


def test_wait_exits_1_when_a_run_is_dead_or_cancelled_and_prints_each(db_url, conn):
    ok, cancelled = insert_run(conn, "test.ok"), insert_run(conn, "test.ok")
    dead = insert_run(conn, "test.ok", status="dead", attempts=3)
    args = ("wait", str(ok), str(cancelled), str(dead), "--json", "--database-url", db_url)
    waiter = jobrunner_process(*args)
    waiting(conn, waiter)
    assert run_cli("cancel", str(cancelled), "--database-url", db_url).exit_code == 0
    factories.tick(db_url, "test.ok")
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 1, err
    rows = json.loads(out)
    assert [(r["id"], r["status"]) for r in rows] == [
        (ok, "succeeded"),
        (cancelled, "cancelled"),
        (dead, "dead"),
    ]
    assert all(r["finished_at"] for r in rows)


def test_wait_exits_124_at_its_timeout_with_the_statuses_so_far(db_url, conn):
    run_id = insert_run(conn, "test.ok")
    result = run_cli("wait", str(run_id), "--timeout", "0.3s", "--database-url", db_url)
    assert result.exit_code == 124
    assert result.stdout.splitlines() == [f"{run_id} queued"]
    assert result.stderr.splitlines() == [
        f"jobrunner: error: timed out: 1 of 1 run(s) not finished ({run_id} queued)"
    ]


def test_wait_for_a_run_that_does_not_exist_is_exit_1(db_url, conn):
    run_id = insert_run(conn, "test.ok", status="succeeded")
    result = run_cli("wait", str(run_id), "424242", "--database-url", db_url)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == ["jobrunner: error: run 424242 not found"]


def test_wait_for_finished_runs_returns_at_once(db_url, conn):
    run_id = insert_run(conn, "test.ok", status="succeeded")
    result = run_cli("wait", str(run_id), "--database-url", db_url)
    assert (result.exit_code, result.stdout) == (0, f"{run_id} succeeded\n")


def test_wait_with_a_bad_id_or_timeout_is_bad_usage(db_url):
    for args in (("wait", "x1"), ("wait", "1", "--timeout", "soon"), ("wait",)):
        result = run_cli(*args, "--database-url", db_url)
        assert result.exit_code == 2, args
        assert len(result.stderr.splitlines()) == 1


# -- the library: cronjob.wait and cronjob.wait_async --


def test_cronjob_wait_returns_the_outcomes_once_a_run_finishes(db_url, conn):
    run_id = insert_run(conn, "test.ok")
    finished_at: list[float] = []

    def finish() -> None:
        waiting(conn)
        factories.tick(db_url, "test.ok")
        finished_at.append(time.monotonic())

    finisher = threading.Thread(target=finish)
    with psycopg.connect(db_url) as app:  # not autocommit: idle, so wait may switch it
        finisher.start()
        (outcome,) = wait(app, [run_id], timeout=30)
        returned = time.monotonic()
        assert app.autocommit is False
    finisher.join()
    assert (outcome.id, outcome.status, outcome.finished) == (run_id, "succeeded", True)
    assert returned - finished_at[0] < SOON
    assert not holders(conn, AWAITING_FINISHES)


def test_cronjob_wait_async_returns_once_a_run_finishes(db_url, conn):
    run_id = insert_run(conn, "test.ok")

    async def scenario() -> list:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as app:
            waiter = asyncio.create_task(wait_async(app, [run_id], timeout=30))
            await asyncio.to_thread(waiting, conn)
            await asyncio.to_thread(factories.tick, db_url, "test.ok")
            return await waiter

    (outcome,) = asyncio.run(scenario())
    assert (outcome.id, outcome.status) == (run_id, "succeeded")


def test_cronjob_wait_refuses_a_connection_inside_a_transaction(db_url, conn):
    run_id = insert_run(conn, "test.ok", status="succeeded")
    with psycopg.connect(db_url) as app:
        app.execute("SELECT 1")
        with pytest.raises(BadInput, match="inside a transaction"):
            wait(app, [run_id])


def test_cronjob_wait_raises_for_unknown_runs_and_at_its_timeout(db_url, conn):
    queued = insert_run(conn, "test.ok")
    with psycopg.connect(db_url, autocommit=True) as app:
        with pytest.raises(RunNotFound):
            wait(app, [queued, 424242])
        with pytest.raises(WaitTimedOut) as timed_out:
            wait(app, [queued], timeout=0.2)
    assert [(o.id, o.status) for o in timed_out.value.outcomes] == [(queued, "queued")]
