"""`async def` handlers: run on the tick's event loop beside the threads, with the same
guarantees as plain handlers; async ctx.db and enqueue_async."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest

import tests.handlers.aio as aio
import tests.handlers.basic  # noqa: F401 - registers the plain test handlers
from cronjob import store
from cronjob.api import enqueue, enqueue_async
from tests.conftest import count, wait_for
from tests.factories import tick
from tests.test_lifecycle import run_row


@pytest.fixture(autouse=True)
def fresh_seen():
    aio.seen.clear()


def test_async_and_plain_handlers_run_in_one_tick(db_url, conn):
    async_ids = [enqueue(conn, "aio.ok", {"sleep": 0.01}) for _ in range(20)]
    plain_ids = [enqueue(conn, "test.ok") for _ in range(20)]

    report = tick(db_url, "aio.ok", "test.ok")

    assert (report.claimed, report.succeeded) == (40, 40)
    assert sorted(aio.seen["ran"]) == async_ids
    assert {run_row(conn, i).status for i in async_ids + plain_ids} == {"succeeded"}


def test_async_handlers_run_concurrently_on_the_loop_not_on_threads(db_url, conn):
    for _ in range(50):
        enqueue(conn, "aio.together", {"n": 50})

    report = tick(db_url, "aio.together", concurrency=1, async_concurrency=50)

    assert report.succeeded == 50
    assert aio.seen["most"] == 50  # all at once, with one worker thread


def test_no_more_coroutines_run_at_once_than_async_concurrency(db_url, conn):
    for _ in range(12):
        enqueue(conn, "aio.counted", {"sleep": 0.05})

    report = tick(db_url, "aio.counted", async_concurrency=5)

    assert report.succeeded == 12
    assert aio.seen["most"] == 5


@pytest.mark.parametrize(
    ("do", "status", "error_type"),
    [("retry", "failed", "Retry"), ("fail", "dead", "Fail"), ("raise", "failed", "ValueError")],
)
def test_an_async_handlers_retry_fail_and_errors_are_recorded_as_a_plain_ones(
    db_url, conn, do, status, error_type
):
    run_id = enqueue(conn, "aio.outcome", {"do": do})
    tick(db_url, "aio.outcome")
    run = run_row(conn, run_id)
    assert (run.status, run.error_type, run.attempts) == (status, error_type, 1)
    if do == "raise":
        history = store.run_attempts_get(conn, run_id)
        assert "ValueError: bad data" in history[0].traceback


def test_an_async_handler_past_its_timeout_is_cancelled_and_the_attempt_is_a_timeout(db_url, conn):
    run_id = enqueue(conn, "aio.slow")
    report = tick(db_url, "aio.slow")
    run = run_row(conn, run_id)
    assert (report.failed, run.status, run.error_type) == (1, "failed", "timeout")
    wait_for(lambda: run_id in aio.seen.get("cancelled", []), "the task to see CancelledError", 5)


def test_an_async_run_cancelled_at_its_timeout_gives_its_place_to_the_next(db_url, conn):
    ids = [enqueue(conn, "aio.slow") for _ in range(3)]
    # The tick's clock pinned: a retry's backoff, jittered down to a moment, would otherwise
    # make a run due again before the tick ends.
    [pinned] = conn.execute("SELECT now() + interval '1 second'").fetchone()

    report = tick(db_url, "aio.slow", async_concurrency=1, now=pinned)

    assert report.failed == 3
    assert {run_row(conn, i).error_type for i in ids} == {"timeout"}
    wait_for(lambda: sorted(aio.seen.get("cancelled", [])) == ids, "each task to be cancelled", 5)


def test_an_async_handler_awaiting_ctx_cancelled_learns_its_run_was_cancelled(db_url, conn):
    run_id = enqueue(conn, "aio.waits_for_cancel")
    done: list[Any] = []
    thread = threading.Thread(
        target=lambda: done.append(tick(db_url, "aio.waits_for_cancel", lease=1.5)), daemon=True
    )
    thread.start()
    wait_for(lambda: aio.seen.get("waiting") == run_id, "the handler to await ctx.cancelled", 10)
    store.runs_cancel_many(conn, [run_id])
    thread.join(20)

    [report] = done
    assert report.lost == 1 and aio.seen["told"] == [run_id]
    assert run_row(conn, run_id).status == "cancelled"


def test_an_async_handler_that_blocks_the_loop_is_named_in_a_warning(db_url, conn, capsys):
    run_id = enqueue(conn, "aio.blocks", {"seconds": 1.6})
    report = tick(db_url, "aio.blocks")
    assert report.succeeded == 1
    logged = capsys.readouterr().err
    assert "an async handler blocks the event loop" in logged
    assert f'"run_id": {run_id}' in logged


def test_writes_through_async_ctx_db_commit_with_the_runs_success(effects_db, conn):
    run_id = enqueue(conn, "aio.effect", {"key": "invoice:7", "at_most_once": "mail:7"})
    report = tick(effects_db, "aio.effect")
    assert report.succeeded == 1 and run_row(conn, run_id).status == "succeeded"
    assert conn.execute("SELECT key, run_id, attempt FROM effect_rows").fetchall() == [
        ("invoice:7", run_id, 1)
    ]
    assert count(conn, "SELECT count(*) FROM job_runs WHERE job_type = 'aio.ok'") == 1
    kinds = conn.execute("SELECT key, kind FROM job_effects ORDER BY key").fetchall()
    assert kinds == [("invoice:7", "once"), ("mail:7", "at_most_once")]


def test_an_async_handler_that_fails_leaves_no_write_and_its_retry_writes_once(effects_db, conn):
    run_id = enqueue(conn, "aio.effect", {"key": "k", "fail_attempts": 1})
    tick(effects_db, "aio.effect")
    assert run_row(conn, run_id).status == "failed"
    assert count(conn, "SELECT count(*) FROM effect_rows") == 0
    assert count(conn, "SELECT count(*) FROM job_runs WHERE job_type = 'aio.ok'") == 0

    conn.execute("UPDATE job_runs SET run_at = now() WHERE id = %s", [run_id])
    tick(effects_db, "aio.effect")
    assert run_row(conn, run_id).status == "succeeded"
    assert conn.execute("SELECT run_id, attempt FROM effect_rows").fetchall() == [(run_id, 2)]


def test_enqueue_async_joins_the_callers_transaction(db_url, conn):
    async def enqueue_then(commit: bool, key: str | None = None) -> int:
        async with await psycopg.AsyncConnection.connect(db_url) as aconn:
            run_id = await enqueue_async(aconn, "test.ok", {"n": 1}, idempotency_key=key)
            await (aconn.commit() if commit else aconn.rollback())
            return run_id

    rolled_back = asyncio.run(enqueue_then(False))
    assert store.run_get(conn, rolled_back) is None
    kept = asyncio.run(enqueue_then(True, key="order:1"))
    assert run_row(conn, kept).status == "queued"
    assert asyncio.run(enqueue_then(True, key="order:1")) == kept  # the same piece of work
    assert count(conn, "SELECT count(*) FROM job_runs") == 1


# -- real tick processes --------------------------------------------------------


def _start(db_url: str, exec_log: Any, *args: str) -> Any:
    from tests.conftest import jobrunner_process

    return jobrunner_process(
        "tick",
        "--database-url",
        db_url,
        "--handlers",
        "tests.handlers.aio",
        "--json",
        *args,
        env={"JOBRUNNER_TEST_EXEC_LOG": str(exec_log)},
    )


def test_a_tick_killed_after_an_async_handlers_write_leaves_neither_write_nor_success(
    effects_db, conn, tmp_path
):
    import signal

    exec_log = tmp_path / "executions.log"
    run_id = enqueue(conn, "aio.writes_then_waits", {"key": "k"})
    victim = _start(effects_db, exec_log)
    wait_for(lambda: exec_log.exists() and "wrote" in exec_log.read_text(), "the write")

    victim.send_signal(signal.SIGKILL)
    victim.wait(10)

    assert count(conn, "SELECT count(*) FROM effect_rows") == 0
    assert run_row(conn, run_id).status == "running"  # until its lease expires


def test_sigterm_hands_back_running_coroutines_past_the_grace_attempt_not_counted(
    db_url, conn, tmp_path
):
    import json
    import signal

    exec_log = tmp_path / "executions.log"
    ids = [enqueue(conn, "aio.sleeps", {"seconds": 30}) for _ in range(3)]
    tick_process = _start(db_url, exec_log, "--grace", "0.5s")
    wait_for(
        lambda: exec_log.exists() and len(exec_log.read_text().splitlines()) >= 3,
        "the coroutines to start",
    )

    tick_process.send_signal(signal.SIGTERM)
    out, err = tick_process.communicate(timeout=30)

    assert tick_process.returncode == 0, err[-2000:]
    summary = json.loads(out)
    assert summary["stopped_by"] == "SIGTERM" and sorted(summary["handed_back_ids"]) == ids
    for run_id in ids:
        run = run_row(conn, run_id)
        assert (run.status, run.attempts, run.locked_by) == ("queued", 0, None)
    assert count(conn, "SELECT count(*) FROM job_attempts") == 0


def test_sigterm_hands_back_async_runs_waiting_for_a_place_and_they_never_start(
    db_url, conn, tmp_path
):
    import json
    import signal

    exec_log = tmp_path / "executions.log"
    first, *waiting = [enqueue(conn, "aio.sleeps", {"seconds": 1}) for _ in range(3)]
    tick_process = _start(db_url, exec_log, "--grace", "10s", "--async-concurrency", "1")
    wait_for(lambda: exec_log.exists() and exec_log.read_text().strip(), "the first to start")

    tick_process.send_signal(signal.SIGTERM)
    out, err = tick_process.communicate(timeout=30)

    assert tick_process.returncode == 0, err[-2000:]
    assert sorted(json.loads(out)["handed_back_ids"]) == waiting
    assert run_row(conn, first).status == "succeeded"  # it returned within the grace period
    assert [(run_row(conn, i).status, run_row(conn, i).attempts) for i in waiting] == [
        ("queued", 0)
    ] * 2
    started = [line for line in exec_log.read_text().splitlines() if "returned" not in line]
    assert len(started) == 1  # its place, freed, went to no run handed back
