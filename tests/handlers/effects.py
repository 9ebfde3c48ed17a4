"""Handlers for the effects tests, used in-process and by real `jobrunner tick` processes.

The database effect is a row in `effect_rows` (created by the tests), written through
`ctx.db` and guarded by `ctx.once`; the external effect is a line appended to a file.
A handler can pause on its first attempt: it creates the file `ready` and waits for
the file `release`, so a test can act (kill the process, steal the lease) at a known
point. Every execution is also logged, like the basic handlers, outside the database.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import psycopg

from cronjob import enqueue, handler
from tests.handlers.basic import record

PAUSE_LIMIT = 30.0  # a paused handler whose test died gives up on its own


def pause(ctx: Any, payload: Any) -> None:
    if "ready" not in payload or ctx.attempt != payload.get("pause_attempt", 1):
        return
    Path(payload["ready"]).touch()
    release = Path(payload.get("release", "/nonexistent/never"))
    deadline = time.monotonic() + PAUSE_LIMIT
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def append_line(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@handler("effects.record", max_attempts=3, lease="30s")
def record_effect(ctx: Any, payload: Any) -> None:
    """One row per business key, in the handler's transaction."""
    record(ctx)
    key = payload["key"]
    if ctx.once(key):
        ctx.db.execute(
            "INSERT INTO effect_rows (key, run_id, attempt) VALUES (%s, %s, %s)",
            (key, ctx.run_id, ctx.attempt),
        )
        if "enqueue" in payload:
            enqueue(ctx.db, "test.ok", {"after": key}, idempotency_key=payload["enqueue"])
    time.sleep(payload.get("hold", 0))
    pause(ctx, payload)
    if ctx.attempt <= payload.get("fail_attempts", 0):
        raise RuntimeError(f"failed after writing {key}")
    ending = payload.get("end_transaction")
    if ending == "commit":
        ctx.db.commit()
    elif ending == "rollback":
        ctx.db.rollback()
    elif ending == "close":
        with ctx.db:
            pass
    elif ending == "savepoint":
        with contextlib.suppress(psycopg.errors.DivisionByZero), ctx.db.transaction():
            ctx.db.execute("SELECT 1/0")
    elif ending == "swallow_error":
        with contextlib.suppress(Exception):
            ctx.db.execute("SELECT 1/0")


@handler("effects.settings", lease="30s")
def read_settings(ctx: Any, payload: Any) -> None:
    """Stores the limits its transaction runs under, after an optional SET LOCAL."""
    if payload.get("statement_timeout"):
        ctx.db.execute(f"SET LOCAL statement_timeout = '{payload['statement_timeout']}'")
    for name in ("statement_timeout", "lock_timeout"):
        value = ctx.db.execute(f"SHOW {name}").fetchone()[0]
        ctx.db.execute(
            "INSERT INTO effect_rows (key, run_id, attempt) VALUES (%s, %s, %s)",
            (f"{name}={value}", ctx.run_id, ctx.attempt),
        )


@handler("effects.notify", max_attempts=3, lease="30s")
def notify(ctx: Any, payload: Any) -> None:
    """An effect outside the database, at most once: a line appended to `outbox`."""
    record(ctx)
    if payload.get("pause_before_record"):
        pause(ctx, payload)
    if not ctx.at_most_once(payload["key"]):
        return
    if not payload.get("pause_before_record"):
        pause(ctx, payload)
    if ctx.attempt <= payload.get("fail_attempts", 0):
        raise RuntimeError("the mail server hung up")
    append_line(payload["outbox"], f"{payload['key']} {ctx.run_id}")


@handler("effects.idle", lease="30s")
def idle(ctx: Any, payload: Any) -> None:
    """Never touches ctx.db."""
    record(ctx)
    pause(ctx, payload)
