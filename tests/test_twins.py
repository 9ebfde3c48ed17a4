"""Plain and async twins keep the same promises: each test runs once with a plain handler
(or `enqueue`) and once with its `async def` twin (or `enqueue_async`).

The twins take the same payloads: `effects.record` and `aio.record` write one row per
business key through the handler's transaction (`ctx.db`, guarded by `ctx.once`);
`effects.notify` and `aio.notify` append a line to an outbox file, guarded by
`ctx.at_most_once`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from cronjob import store
from cronjob.api import enqueue, enqueue_async
from cronjob.context import AsyncJobContext, JobContext, LeaseLost
from cronjob.db import Database
from cronjob.models import ClaimedRun
from cronjob.report import TickReport
from tests.conftest import count
from tests.factories import tick
from tests.handlers import aio, effects  # noqa: F401 - register the test handlers
from tests.test_effects import HOUR, ledger, wait_until_blocked
from tests.test_lifecycle import db_now, run_row

KINDS = ["plain", "async"]
RECORD = {"plain": "effects.record", "async": "aio.record"}
NOTIFY = {"plain": "effects.notify", "async": "aio.notify"}

twins = pytest.mark.parametrize("kind", KINDS)


def effect_rows(conn: psycopg.Connection[Any], key: str) -> list[tuple[int, int]]:
    return conn.execute(
        "SELECT run_id, attempt FROM effect_rows WHERE key = %s ORDER BY run_id", (key,)
    ).fetchall()


def tick_one_at_a_time(db_url: str, job_type: str, **options: Any) -> TickReport:
    """A tick whose runs of `job_type` run one after another, whichever kind it is."""
    return tick(db_url, job_type, concurrency=1, async_concurrency=1, **options)


# -- the handler's transaction ---------------------------------------------------


@twins
def test_writes_through_ctx_db_commit_with_the_runs_success(effects_db, conn, kind):
    run_id = enqueue(conn, RECORD[kind], {"key": "invoice:7"})

    report = tick(effects_db, RECORD[kind])

    assert report.succeeded == 1 and run_row(conn, run_id).status == "succeeded"
    assert effect_rows(conn, "invoice:7") == [(run_id, 1)]
    assert ledger(conn) == [("invoice:7", run_id, "once")]


@twins
def test_a_handler_that_writes_then_raises_leaves_nothing_and_its_retry_writes_once(
    effects_db, conn, kind
):
    run_id = enqueue(conn, RECORD[kind], {"key": "invoice:7", "fail_attempts": 1})

    assert tick(effects_db, RECORD[kind]).failed == 1
    run = run_row(conn, run_id)
    assert (run.status, run.last_error) == ("failed", "failed after writing invoice:7")
    assert effect_rows(conn, "invoice:7") == [] and ledger(conn) == []

    tick(effects_db, RECORD[kind], now=db_now(conn) + HOUR)
    assert run_row(conn, run_id).status == "succeeded"
    assert effect_rows(conn, "invoice:7") == [(run_id, 2)]


@twins
def test_a_job_enqueued_through_ctx_db_exists_only_if_the_run_succeeds(effects_db, conn, kind):
    failing = enqueue(conn, RECORD[kind], {"key": "a", "enqueue": "after:a", "fail_attempts": 3})
    enqueue(conn, RECORD[kind], {"key": "b", "enqueue": "after:b"})

    tick(effects_db, RECORD[kind])

    keys = conn.execute("SELECT idempotency_key FROM job_runs WHERE job_type = 'test.ok'")
    assert [key for (key,) in keys] == ["after:b"]
    assert run_row(conn, failing).status == "failed"


ENDINGS = {
    "commit": "committed or rolled back ctx.db itself",
    "rollback": "committed or rolled back ctx.db itself",
    "close": "closed ctx.db",
    "swallow_error": "transaction is aborted",
}


@twins
@pytest.mark.parametrize(("ending", "message"), ENDINGS.items(), ids=ENDINGS.keys())
def test_a_handler_that_ends_its_transaction_itself_fails_the_attempt(
    effects_db, conn, kind, ending, message
):
    run_id = enqueue(conn, RECORD[kind], {"key": "k", "end_transaction": ending})

    assert tick(effects_db, RECORD[kind]).failed == 1

    run = run_row(conn, run_id)
    assert (run.status, run.error_type) == ("failed", "cronjob.context.HandlerTransactionError")
    assert message in run.last_error


@twins
def test_a_statement_failing_inside_a_savepoint_does_not_spoil_the_transaction(
    effects_db, conn, kind
):
    run_id = enqueue(conn, RECORD[kind], {"key": "k", "end_transaction": "savepoint"})
    tick(effects_db, RECORD[kind])
    assert run_row(conn, run_id).status == "succeeded"
    assert effect_rows(conn, "k") == [(run_id, 1)]


# -- once: effects in the database, exactly once ------------------------------------


@twins
def test_runs_sharing_a_business_key_one_after_another_make_one_effect(effects_db, conn, kind):
    first, second = (enqueue(conn, RECORD[kind], {"key": "weekly:1"}) for _ in range(2))

    report = tick_one_at_a_time(effects_db, RECORD[kind])

    assert report.succeeded == 2
    assert effect_rows(conn, "weekly:1") == [(first, 1)]
    assert ledger(conn) == [("weekly:1", first, "once")]
    assert run_row(conn, second).status == "succeeded"


@twins
def test_runs_sharing_a_business_key_at_once_make_one_effect(effects_db, conn, kind):
    # Held open a moment after once(), so the transactions overlap: the later ones wait
    # on the first's key, then see it committed.
    ids = [enqueue(conn, RECORD[kind], {"key": "weekly:1", "hold": 0.3}) for _ in range(3)]

    report = tick(effects_db, RECORD[kind], concurrency=3, async_concurrency=3)

    assert report.succeeded == 3
    [(winner, _)] = effect_rows(conn, "weekly:1")
    assert winner in ids and ledger(conn) == [("weekly:1", winner, "once")]


@twins
def test_a_key_recorded_by_a_failed_attempt_is_free_for_the_next_run(effects_db, conn, kind):
    first = enqueue(conn, RECORD[kind], {"key": "k", "fail_attempts": 3})
    tick(effects_db, RECORD[kind])
    second = enqueue(conn, RECORD[kind], {"key": "k"})
    tick(effects_db, RECORD[kind])
    assert run_row(conn, first).status == "failed"
    assert effect_rows(conn, "k") == [(second, 1)]


# -- at most once: effects outside the database ---------------------------------------


@twins
def test_at_most_once_never_repeats_an_effect_even_when_the_run_fails_after_it(
    effects_db, conn, tmp_path, kind
):
    outbox = tmp_path / "outbox"
    first, second = (
        enqueue(conn, NOTIFY[kind], {"key": "mail:7", "outbox": str(outbox)}) for _ in range(2)
    )
    tick_one_at_a_time(effects_db, NOTIFY[kind])
    assert outbox.read_text().splitlines() == [f"mail:7 {first}"]
    assert run_row(conn, second).status == "succeeded"

    # The mail server hangs up after the record: the retry does not send again.
    payload = {"key": "mail:8", "outbox": str(outbox), "fail_attempts": 1}
    third = enqueue(conn, NOTIFY[kind], payload)
    tick(effects_db, NOTIFY[kind])
    tick(effects_db, NOTIFY[kind], now=db_now(conn) + HOUR)
    assert run_row(conn, third).status == "succeeded"
    assert outbox.read_text().splitlines() == [f"mail:7 {first}"]
    assert [(key, kind_) for key, _, kind_ in ledger(conn)] == [
        ("mail:7", "at_most_once"),
        ("mail:8", "at_most_once"),
    ]


# -- ctx without a lease, and bad keys -------------------------------------------------


class Unconnected(Database):
    def connect(self, *, autocommit: bool = True) -> Any:
        pytest.fail("no connection needed")

    async def connect_async(self, *, autocommit: bool = True) -> Any:
        pytest.fail("no connection needed")


def context(kind: str) -> JobContext:
    run = ClaimedRun(1, "t", {}, None, None, 1, False, None)  # type: ignore[arg-type]
    database = Unconnected("postgresql:///never-connected")
    return AsyncJobContext(run, database) if kind == "async" else JobContext(run, database)


def call(ctx: JobContext, method: str, key: Any) -> Any:
    """`ctx.once(key)` or `ctx.at_most_once(key)`, awaited for an async context."""
    result = getattr(ctx, method)(key)
    return asyncio.run(result) if isinstance(ctx, AsyncJobContext) else result


@twins
@pytest.mark.parametrize("method", ["once", "at_most_once"])
def test_a_run_that_was_cancelled_or_lost_its_lease_records_no_more_keys(kind, method):
    ctx = context(kind)
    ctx.cancelled.set()
    with pytest.raises(LeaseLost):
        call(ctx, method, "k")


@twins
@pytest.mark.parametrize("method", ["once", "at_most_once"])
@pytest.mark.parametrize("key", ["", "a\x00b", "é" * 501, 7], ids=["empty", "NUL", "long", "int"])
def test_effect_keys_are_checked(kind, method, key):
    with pytest.raises(ValueError):
        call(context(kind), method, key)


# -- enqueue and enqueue_async ---------------------------------------------------------


def enqueue_in_transaction(
    kind: str, db_url: str, job_type: str, *, then: str = "commit", **options: Any
) -> int:
    """Enqueue in a transaction of its own, on a connection (`enqueue`) or an async one
    (`enqueue_async`), which then commits or rolls back; returns the run id."""
    if kind == "plain":
        with psycopg.connect(db_url) as app:
            run_id = enqueue(app, job_type, {"by": kind}, **options)
            getattr(app, then)()
            return run_id

    async def enqueuing() -> int:
        async with await psycopg.AsyncConnection.connect(db_url) as app:
            run_id = await enqueue_async(app, job_type, {"by": kind}, **options)
            await getattr(app, then)()
            return run_id

    return asyncio.run(enqueuing())


@twins
def test_an_enqueue_exists_only_if_the_callers_transaction_commits(db_url, conn, kind):
    rolled_back = enqueue_in_transaction(kind, db_url, "test.ok", then="rollback")
    kept = enqueue_in_transaction(kind, db_url, "test.ok")
    assert store.run_get(conn, rolled_back) is None
    assert run_row(conn, kept).status == "queued"


@twins
def test_an_existing_key_returns_the_existing_run(db_url, conn, kind):
    first = enqueue(conn, "test.ok", {"by": "first"}, idempotency_key="order:42")
    again = enqueue_in_transaction(kind, db_url, "test.ok", idempotency_key="order:42")
    assert again == first
    assert conn.execute("SELECT payload->>'by' FROM job_runs").fetchall() == [("first",)]


@twins
@pytest.mark.parametrize(
    "other", [{"job_type": "test.fail"}, {"tenant_id": "acme"}], ids=["type", "tenant"]
)
def test_a_key_used_by_another_type_or_tenant_is_a_run_of_its_own(db_url, conn, kind, other):
    first = enqueue(conn, "test.ok", idempotency_key="order:42")
    job_type = other.get("job_type", "test.ok")
    tenant = {"tenant_id": other["tenant_id"]} if "tenant_id" in other else {}
    second = enqueue_in_transaction(kind, db_url, job_type, idempotency_key="order:42", **tenant)
    again = enqueue_in_transaction(kind, db_url, job_type, idempotency_key="order:42", **tenant)
    assert second != first and again == second
    assert count(conn, "SELECT count(*) FROM job_runs") == 2


@twins
@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_an_enqueue_waiting_on_the_same_key_follows_the_first_transactions_fate(
    db_url, conn, kind, first_ends
):
    with psycopg.connect(db_url) as first:
        first_id = enqueue(first, "test.ok", {"by": "first"}, idempotency_key="order:42")
        result: list[int] = []
        waiter = background(
            lambda: result.append(
                enqueue_in_transaction(kind, db_url, "test.ok", idempotency_key="order:42")
            )
        )
        wait_until_blocked(conn)
        getattr(first, first_ends)()
        waiter.join(10)

    [second_id] = result
    rows = conn.execute("SELECT id, payload->>'by' FROM job_runs").fetchall()
    if first_ends == "commit":
        assert second_id == first_id and rows == [(first_id, "first")]
    else:
        assert second_id != first_id and rows == [(second_id, kind)]


def background(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_each_async_twin_is_an_async_handler_and_each_plain_twin_is_not():
    from cronjob.handlers import registry

    for twins_of in (RECORD, NOTIFY):
        assert not registry()[twins_of["plain"]].is_async
        assert registry()[twins_of["async"]].is_async
