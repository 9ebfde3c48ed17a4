"""The shop's jobs, tested through the `jobrunner` fixture as its developers would."""

from datetime import timedelta

import pytest
from shop.accounts import place_order, remind_later, sign_up

from cronjob import enqueue
from cronjob.testing import Drained


def test_signing_up_enqueues_a_welcome_email(jobrunner):
    user_id = sign_up(jobrunner.conn, "ada@example.com")

    jobrunner.assert_enqueued("send_welcome_email", payload={"to": "ada@example.com"})
    jobrunner.assert_enqueued(payload={"user_id": user_id}, run_at=jobrunner.now, count=1)
    jobrunner.refute_enqueued("charge_card")


def test_the_welcome_email_is_sent_by_a_drain(jobrunner):
    user_id = sign_up(jobrunner.conn, "ada@example.com")

    assert jobrunner.drain() == Drained(succeeded=1)

    assert jobrunner.enqueued() == []
    welcomed = jobrunner.conn.execute("SELECT welcomed FROM users WHERE id = %s", [user_id])
    assert welcomed.fetchone() == (True,)


def test_each_test_starts_from_an_empty_queue(jobrunner):
    assert jobrunner.enqueued() == []
    assert jobrunner.conn.execute("SELECT count(*) FROM users").fetchone() == (0,)


def test_a_paid_order_enqueues_its_receipt_and_the_drain_runs_that_too(jobrunner):
    order_id = place_order(jobrunner.conn, user_id=7, amount_cents=1250)
    jobrunner.assert_enqueued("charge_card", payload={"order_id": order_id}, tenant=7)

    drained = jobrunner.drain()

    assert drained == Drained(succeeded=2)
    assert [a.job_type for a in drained.attempts] == ["charge_card", "send_receipt"]
    subjects = jobrunner.conn.execute("SELECT subject FROM outbox").fetchall()
    assert subjects == [(f"Receipt for order {order_id}",)]


def test_a_failed_charge_is_retried_after_its_backoff(jobrunner, gateway):
    gateway.answers[:] = ["timeout", "ok"]
    place_order(jobrunner.conn, user_id=7, amount_cents=1250)

    assert jobrunner.drain() == Drained(failed=1)
    [waiting] = jobrunner.assert_enqueued("charge_card", status="failed", attempts=1)
    assert waiting.last_error == "the gateway did not answer"
    assert jobrunner.drain() == Drained()  # not due yet: the backoff is at most a minute

    jobrunner.advance("1m")
    assert jobrunner.drain() == Drained(succeeded=2)  # the charge, then its receipt
    assert len(gateway.calls) == 2


def test_a_charge_that_keeps_failing_ends_dead(jobrunner, gateway):
    gateway.answers[:] = ["timeout"] * 3
    order_id = place_order(jobrunner.conn, user_id=7, amount_cents=1250)

    outcomes = []
    for _ in range(3):
        outcomes.append(jobrunner.drain())
        jobrunner.advance("10m")

    assert outcomes == [Drained(failed=1), Drained(failed=1), Drained(dead=1)]
    jobrunner.refute_enqueued("charge_card")
    paid = jobrunner.conn.execute("SELECT paid FROM orders WHERE id = %s", [order_id])
    assert paid.fetchone() == (False,)


def test_a_declined_card_is_not_retried(jobrunner, gateway):
    gateway.answers[:] = ["declined"]
    place_order(jobrunner.conn, user_id=7, amount_cents=1250)

    drained = jobrunner.drain()

    assert drained == Drained(dead=1)
    assert drained.attempts[0].error.message == "card declined"


def test_a_reminder_waits_a_day(jobrunner):
    remind_later(jobrunner.conn, user_id=7)
    jobrunner.assert_enqueued("send_reminder", run_at="1d")

    assert jobrunner.drain() == Drained()
    jobrunner.advance(timedelta(hours=23, minutes=59))
    assert jobrunner.drain() == Drained()
    jobrunner.advance("1m")
    assert jobrunner.drain() == Drained(succeeded=1)


def test_the_nightly_report_runs_at_two(jobrunner):
    schedule = jobrunner.add_schedule("nightly", cron="0 2 * * *", job_type="nightly_report")
    assert jobrunner.materialize() == 0

    jobrunner.advance(schedule.next_fire_at - jobrunner.now)
    assert jobrunner.materialize() == 1
    [run] = jobrunner.assert_enqueued("nightly_report", scheduled_for=schedule.next_fire_at)

    assert jobrunner.drain() == Drained(succeeded=1)
    day = jobrunner.conn.execute("SELECT day FROM reports").fetchone()[0]
    assert day == run.scheduled_for.date()


def test_a_handler_is_called_alone_with_run_handler(jobrunner, gateway):
    gateway.answers[:] = ["declined"]
    order_id = jobrunner.conn.execute(
        "INSERT INTO orders (user_id, amount_cents) VALUES (7, 990) RETURNING id"
    ).fetchone()[0]

    handled = jobrunner.run_handler("charge_card", {"order_id": order_id, "card": "4000"})

    assert handled.status == "dead"
    assert str(handled.raised) == "card declined"
    assert gateway.calls == [("4000", 990)]
    assert jobrunner.enqueued() == []


def test_a_retry_asked_for_by_the_handler_is_due_after_its_delay(jobrunner):
    handled = jobrunner.run_handler("rate_limited_export", {})
    assert (handled.status, handled.retry_delay) == ("failed", 30.0)

    enqueue(jobrunner.conn, "rate_limited_export", {})
    assert jobrunner.drain() == Drained(failed=1)
    jobrunner.advance("30s")
    assert jobrunner.drain(types=["rate_limited_export"]) == Drained(failed=1)


@pytest.mark.anyio
async def test_an_async_handler_is_awaited_by_adrain(jobrunner):
    from cronjob import enqueue_async

    await enqueue_async(jobrunner.aconn, "notify_async", {"to": "ada@example.com"})

    assert await jobrunner.adrain() == Drained(succeeded=1)
    rows = jobrunner.conn.execute("SELECT address, subject FROM outbox").fetchall()
    assert rows == [("ada@example.com", "Notified")]
