"""`async def` handlers for the async tests, used in-process by library ticks.

Some are the async twins of plain handlers elsewhere (`aio.record` of `effects.record`,
`aio.notify` of `effects.notify`, `aio.fail_slowly` of `test.fail_slowly`): the same
payload does the same thing, so one test runs against both.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

import psycopg

from cronjob import Backoff, Fail, Retry, enqueue_async, handler
from tests import exec_log

# What the handlers saw, for the tests to read (in-process ticks only).
seen: dict[str, Any] = {}


@handler("aio.ok")
async def ok(ctx: Any, payload: Any) -> None:
    await asyncio.sleep(payload.get("sleep", 0))
    seen.setdefault("ran", []).append(ctx.run_id)


@handler("aio.outcome", max_attempts=3)
async def outcome(ctx: Any, payload: Any) -> None:
    await asyncio.sleep(0)
    if payload["do"] == "retry":
        raise Retry(delay="1h")
    if payload["do"] == "fail":
        raise Fail("no such customer")
    raise ValueError("bad data")


@handler("aio.together")
async def together(ctx: Any, payload: Any) -> None:
    """Waits until `n` of its kind run at once: proves they share the loop, not threads."""
    seen["running"] = seen.get("running", 0) + 1
    seen["most"] = max(seen.get("most", 0), seen["running"])
    deadline = time.monotonic() + 10
    while seen["most"] < payload["n"] and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    seen["running"] -= 1


@handler("aio.counted")
async def counted(ctx: Any, payload: Any) -> None:
    """Counts how many of its kind run at once."""
    seen["running"] = seen.get("running", 0) + 1
    seen["most"] = max(seen.get("most", 0), seen["running"])
    await asyncio.sleep(payload["sleep"])
    seen["running"] -= 1


@handler("aio.slow", timeout=0.3)
async def slow(ctx: Any, payload: Any) -> None:
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        seen.setdefault("cancelled", []).append(ctx.run_id)
        raise


@handler("aio.waits_for_cancel", lease="30s")
async def waits_for_cancel(ctx: Any, payload: Any) -> None:
    seen["waiting"] = ctx.run_id
    await asyncio.wait_for(_cancelled(ctx), 20)
    seen.setdefault("told", []).append(ctx.run_id)


async def _cancelled(ctx: Any) -> None:
    await ctx.cancelled


@handler("aio.blocks")
async def blocks(ctx: Any, payload: Any) -> None:
    time.sleep(payload["seconds"])  # the mistake: blocks the event loop


@handler("aio.effect", max_attempts=3)
async def effect(ctx: Any, payload: Any) -> None:
    """One effect row per key through the async ctx.db, and a follow-up run enqueued with it."""
    db = await ctx.db
    if await ctx.once(payload["key"]):
        await db.execute(
            "INSERT INTO effect_rows (key, run_id, attempt) VALUES (%s, %s, %s)",
            (payload["key"], ctx.run_id, ctx.attempt),
        )
        await enqueue_async(db, "aio.ok", {"after": payload["key"]})
    if ctx.attempt <= payload.get("fail_attempts", 0):
        raise RuntimeError("failed after writing")
    if payload.get("at_most_once"):
        assert await ctx.at_most_once(payload["at_most_once"])


@handler("aio.recorded")
async def recorded(ctx: Any, payload: Any) -> None:
    """Notes each execution outside the database, for real tick processes."""
    await asyncio.sleep(0)
    exec_log.record(ctx)


@handler("aio.sleeps")
async def sleeps(ctx: Any, payload: Any) -> None:
    exec_log.record(ctx)
    await asyncio.sleep(payload["seconds"])
    exec_log.record(ctx, "returned")


@handler("aio.writes_then_waits", lease="30s")
async def writes_then_waits(ctx: Any, payload: Any) -> None:
    """Writes through ctx.db, then waits (a test kills the process meanwhile) before returning."""
    db = await ctx.db
    await db.execute(
        "INSERT INTO effect_rows (key, run_id, attempt) VALUES (%s, %s, %s)",
        (payload["key"], ctx.run_id, ctx.attempt),
    )
    exec_log.record(ctx, "wrote")
    await asyncio.sleep(payload.get("seconds", 30))


@handler("aio.fail_slowly", max_attempts=4, backoff=Backoff(base=100, cap=300))
async def fail_slowly(ctx: Any, payload: Any) -> None:
    await asyncio.sleep(0)
    raise RuntimeError("still failing")


@handler("aio.record", max_attempts=3, lease="30s")
async def record_effect(ctx: Any, payload: Any) -> None:
    """effects.record's twin: one row per business key, in the handler's transaction."""
    exec_log.record(ctx)
    db = await ctx.db
    key = payload["key"]
    if await ctx.once(key):
        await db.execute(
            "INSERT INTO effect_rows (key, run_id, attempt) VALUES (%s, %s, %s)",
            (key, ctx.run_id, ctx.attempt),
        )
        if "enqueue" in payload:
            await enqueue_async(db, "test.ok", {"after": key}, idempotency_key=payload["enqueue"])
    await asyncio.sleep(payload.get("hold", 0))
    if ctx.attempt <= payload.get("fail_attempts", 0):
        raise RuntimeError(f"failed after writing {key}")
    await _end_transaction(db, payload.get("end_transaction"))


async def _end_transaction(db: Any, ending: str | None) -> None:
    if ending == "commit":
        await db.commit()
    elif ending == "rollback":
        await db.rollback()
    elif ending == "close":
        async with db:
            pass
    elif ending == "savepoint":
        with contextlib.suppress(psycopg.errors.DivisionByZero):
            async with db.transaction():
                await db.execute("SELECT 1/0")
    elif ending == "swallow_error":
        with contextlib.suppress(Exception):
            await db.execute("SELECT 1/0")


@handler("aio.notify", max_attempts=3, lease="30s")
async def notify(ctx: Any, payload: Any) -> None:
    """effects.notify's twin: an effect outside the database, at most once (a line in
    `outbox`)."""
    exec_log.record(ctx)
    if not await ctx.at_most_once(payload["key"]):
        return
    if ctx.attempt <= payload.get("fail_attempts", 0):
        raise RuntimeError("the mail server hung up")
    fd = os.open(payload["outbox"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{payload['key']} {ctx.run_id}\n".encode())
    finally:
        os.close(fd)
