"""Handlers that log, trace and fail, for the tests of what a tick records around an attempt:
run logs, spans, error reports."""

from __future__ import annotations

import logging
from typing import Any

from cronjob import Retry, handler
from tests.exec_log import record


@handler("test.chatty", max_attempts=3)
def chatty(ctx: Any, payload: Any) -> None:
    """Logs three events an attempt (one naming a database with its password), and fails
    on its first attempt."""
    ctx.log.info("charging card", amount=payload.get("amount", 10))
    ctx.log.warning("connecting", url="postgresql://shop:hunter2-secret@db.internal/shop")
    logging.getLogger("shop.payments").warning("slow answer from %s", "the bank")
    if ctx.attempt == 1:
        raise RuntimeError("card declined")


@handler("test.quiet_chatty", capture_logs=False)
def quiet_chatty(ctx: Any, payload: Any) -> None:
    ctx.log.info("not kept")


@handler("test.log_flood")
def log_flood(ctx: Any, payload: Any) -> None:
    for i in range(payload.get("events", 250)):
        ctx.log.info("line", n=i)


@handler("test.traced")
def traced(ctx: Any, payload: Any) -> None:
    """Marks its attempt's span, and traces a step of its own inside it."""
    from opentelemetry import trace

    ctx.span.set_attribute("shop.order", payload.get("order", 0))
    ctx.span.set_attribute("shop.current_is_ctx_span", trace.get_current_span() is ctx.span)
    with trace.get_tracer("shop").start_as_current_span("charge card"):
        pass


@handler("test.traced_failure", max_attempts=1)
def traced_failure(ctx: Any, payload: Any) -> None:
    raise ValueError("the bank said no")


@handler("test.slow", lease="30s")
def slow(ctx: Any, payload: Any) -> None:
    """Runs until told to stop, or for `seconds`."""
    record(ctx)  # a test that stops the tick waits for the handler to be running
    ctx.log.info("started")
    ctx.cancelled.wait(float(payload.get("seconds", 30)))


@handler("test.retry_soon")
def retry_soon(ctx: Any, payload: Any) -> None:
    raise Retry(delay="1m")


@handler("test.logs_then_hangs", timeout="1s", max_attempts=1)
def logs_then_hangs(ctx: Any, payload: Any) -> None:
    ctx.log.info("about to hang")
    ctx.cancelled.wait(5)
    ctx.log.info("too late to be kept")


@handler("test.log_wide")
def log_wide(ctx: Any, payload: Any) -> None:
    """Logs `events` events of `width` characters of three bytes each in UTF-8."""
    for i in range(payload.get("events", 100)):
        ctx.log.info("日本語" * (payload.get("width", 300) // 3), n=i)


@handler("test.leaky_failure", max_attempts=1)
def leaky_failure(ctx: Any, payload: Any) -> None:
    """Fails with secrets in its message, and a payload's card number in a local variable."""
    card = payload["card"]
    headers = {"Authorization": f"Bearer {payload['bearer']}"}
    raise ConnectionError(
        f"cannot reach postgresql://shop:{payload['password']}@db.internal/shop"
        f" with token={payload['token']} and {headers} for card ending {card[-4:]}"
    )
