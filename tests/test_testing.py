"""cronjob.testing's drain keeps the tick's promises inside a test's transaction.

A run's handler writes and its success commit together or not at all; an at-most-once key
outlives a failed attempt; a handler that ends ctx.db itself fails its attempt as the tick
fails it; what it logs is kept; limits and the clock hold; and nothing outlives the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cronjob import Retry, enqueue, handler, store
from cronjob.testing import Drained, Jobrunner
from cronjob.testing.database import TestDatabase


@pytest.fixture
def runner(db_url: str, fresh_registry: Any) -> Iterator[Jobrunner]:
    """What the `jobrunner` fixture gives a test, on this session's database."""
    database = TestDatabase(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS sent (what text)")
    try:
        with database.transaction() as conn:
            yield Jobrunner.begin(conn)
    finally:
        database.close()


def sent(runner: Jobrunner) -> list[str]:
    return [row[0] for row in runner.conn.execute("SELECT what FROM sent ORDER BY what")]


def test_a_failed_attempts_writes_roll_back_and_its_retry_is_recorded(runner):
    @handler("flaky", max_attempts=2, backoff="1m")
    def flaky(ctx, payload):
        ctx.db.execute("INSERT INTO sent VALUES (%s)", [f"attempt {ctx.attempt}"])
        if ctx.attempt == 1:
            raise RuntimeError("not yet")

    run_id = enqueue(runner.conn, "flaky")
    assert runner.drain() == Drained(failed=1)
    assert sent(runner) == []
    [attempt] = store.run_attempts_get(runner.conn, run_id)
    assert (attempt.error_type, attempt.message) == ("RuntimeError", "not yet")

    runner.advance("1m")
    assert runner.drain() == Drained(succeeded=1)
    assert sent(runner) == ["attempt 2"]
    assert store.run_get(runner.conn, run_id).status.value == "succeeded"


def test_an_at_most_once_key_outlives_the_attempt_that_failed_after_it(runner):
    @handler("sms", backoff="1s")
    def sms(ctx, payload):
        ctx.db.execute("SELECT 1")  # the attempt's savepoint is open before the key
        if ctx.at_most_once("sms:1"):
            ctx.db.execute("INSERT INTO sent VALUES ('sms')")  # rolled back below
            raise RuntimeError("the phone company hung up")

    enqueue(runner.conn, "sms")
    assert runner.drain() == Drained(failed=1)
    runner.advance("1s")
    assert runner.drain() == Drained(succeeded=1)  # the key is there: nothing sent again
    assert sent(runner) == []


def test_a_handler_that_commits_ctx_db_itself_fails_its_attempt(runner):
    @handler("committer", max_attempts=1)
    def committer(ctx, payload):
        ctx.db.execute("INSERT INTO sent VALUES ('committed')")
        ctx.db.commit()

    enqueue(runner.conn, "committer")
    drained = runner.drain()
    assert drained == Drained(dead=1)
    assert "committed or rolled back ctx.db itself" in drained.attempts[0].error.message


def test_what_a_handler_logs_is_kept_with_its_attempt(runner):
    @handler("chatty")
    def chatty(ctx, payload):
        ctx.log.info("hello from the handler", n=1)

    run_id = enqueue(runner.conn, "chatty")
    runner.drain()
    [logged] = store.run_logs_get(runner.conn, run_id)
    assert logged.outcome == "succeeded"
    assert [event["event"] for event in logged.events] == ["hello from the handler"]


def test_a_rate_limit_holds_by_the_tests_clock(runner):
    @handler("export")
    def export(ctx, payload):
        pass

    runner.limit("export", rate="1/1m")
    enqueue(runner.conn, "export")
    enqueue(runner.conn, "export")
    assert runner.drain() == Drained(succeeded=1)
    runner.advance("1m")
    assert runner.drain() == Drained(succeeded=1)


def test_a_retry_due_at_once_is_run_again_in_the_same_drain(runner):
    @handler("again", max_attempts=3)
    def again(ctx, payload):
        raise Retry(0)

    enqueue(runner.conn, "again")
    assert runner.drain() == Drained(failed=2, dead=1)


def test_run_handler_returns_what_the_handler_returned_and_leaves_no_run(runner):
    @handler("double")
    def double(ctx, payload):
        ctx.db.execute("INSERT INTO sent VALUES (%s)", [f"tenant {ctx.tenant_id}"])
        return payload["n"] * 2

    handled = runner.run_handler("double", {"n": 21}, tenant=7)
    assert (handled.value, handled.status, handled.raised) == (42, "succeeded", None)
    assert sent(runner) == ["tenant 7"]
    assert runner.conn.execute("SELECT count(*) FROM job_runs").fetchone() == (0,)


def test_run_handler_on_the_final_attempt_decides_dead(runner):
    @handler("fragile", max_attempts=3)
    def fragile(ctx, payload):
        raise ValueError(f"attempt {ctx.attempt}")

    assert runner.run_handler("fragile", attempt=2).status == "failed"
    dead = runner.run_handler("fragile", attempt=3)
    assert (dead.status, dead.error.message) == ("dead", "attempt 3")


def test_an_async_handler_cannot_be_drained_inside_a_running_loop(runner):
    @handler("later")
    async def later(ctx, payload):
        pass

    enqueue(runner.conn, "later")

    async def sync_drain_in_async_code() -> None:
        runner.drain()

    with pytest.raises(RuntimeError, match=r"use `await jobrunner.adrain\(\)`"):
        asyncio.run(sync_drain_in_async_code())
    assert asyncio.run(runner.adrain()) == Drained(succeeded=1)


def test_the_apps_own_commit_is_refused_in_the_tests_transaction(runner):
    enqueue(runner.conn, "t")
    with pytest.raises(psycopg.ProgrammingError, match="commit"):
        runner.conn.commit()


def test_nothing_outlives_the_test(db_url):
    database = TestDatabase(db_url)
    try:
        with database.transaction() as conn:
            first = Jobrunner.begin(conn)
            enqueue(conn, "t")
            first.advance("1d")
        with database.transaction() as conn:
            second = Jobrunner.begin(conn)
            assert second.enqueued() == []
            assert second.now == conn.execute("SELECT now()").fetchone()[0]
    finally:
        database.close()


def test_an_assertion_on_a_count_says_how_many_matched(runner):
    enqueue(runner.conn, "t", {"n": 1})
    enqueue(runner.conn, "t", {"n": 1})
    with pytest.raises(AssertionError) as failed:
        runner.assert_enqueued("t", payload={"n": 1}, count=1)
    message = str(failed.value)
    assert message.startswith(
        "expected 1 waiting run(s) of job type 't' with payload containing {\"n\": 1}; found 2"
    )
    assert "matching (2):" in message


def test_matching_by_an_unknown_field_says_which_there_are(runner):
    with pytest.raises(TypeError, match="cannot match runs by 'colour': match by one of"):
        runner.enqueued(colour="red")


def test_the_code_under_test_may_start_a_pipeline_after_an_assertion(runner):
    enqueue(runner.conn, "t")
    runner.assert_enqueued("t")
    with runner.conn.pipeline():  # psycopg fails a pipeline started just after a stream
        enqueue(runner.conn, "t")
    runner.assert_enqueued("t", count=2)


def test_outside_a_transaction_the_helper_refuses_in_one_line(db_url):
    with (
        psycopg.connect(db_url, autocommit=True) as conn,
        pytest.raises(RuntimeError, match="jobrunner needs the test's open transaction"),
    ):
        Jobrunner.begin(conn)
