"""Handlers for the fault suite's real `jobrunner tick` processes.

Every execution appends "<run id> <attempt> <pid> <event>" to the file named by
JOBRUNNER_TEST_EXEC_LOG, so a test can tell from outside the database which
process ran what, and what each handler saw.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from cronjob import handler
from tests import exec_log


def record(ctx: Any, event: str = "run") -> None:
    exec_log.record(ctx, event)


@handler("fault.work")
def work(ctx: Any, payload: Any) -> None:
    """A short piece of work: `ms` milliseconds."""
    record(ctx)
    time.sleep(float(payload.get("ms", 10)) / 1000)


@handler("fault.gated")
def gated(ctx: Any, payload: Any) -> None:
    """Waits for the file `payload["release"]` to exist (a minute at most), then succeeds:
    the test acts on the database while the drain is in the middle of its runs."""
    record(ctx)
    release = Path(payload["release"])
    deadline = time.monotonic() + 60
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


@handler("fault.block_first")
def block_first(ctx: Any, payload: Any) -> None:
    """The first attempt blocks until told to stop, then fails; later attempts succeed.

    Were the first attempt's outcome ever recorded, the run would show its error.
    """
    record(ctx)
    if ctx.attempt > 1:
        return
    cancelled = ctx.cancelled.wait(float(payload.get("seconds", 30)))
    record(ctx, "cancelled" if cancelled else "returned")
    raise RuntimeError("late outcome of the first attempt")


@handler("fault.cleans_up")
def cleans_up(ctx: Any, payload: Any) -> None:
    """Works until told to stop, then takes `cleanup_ms` to clean up before returning."""
    record(ctx)
    if ctx.cancelled.wait(float(payload.get("seconds", 30))):
        record(ctx, "cancelled")
        time.sleep(float(payload.get("cleanup_ms", 500)) / 1000)
        record(ctx, "cleaned_up")


@handler("fault.sleep")
def sleep(ctx: Any, payload: Any) -> None:
    """Sleeps `seconds`, ignoring cancellation, then succeeds."""
    record(ctx)
    time.sleep(float(payload.get("seconds", 1)))
    record(ctx, "returned")


@handler("fault.exit_first")
def exit_first(ctx: Any, payload: Any) -> None:
    """The first attempt takes the whole process down with os._exit."""
    record(ctx)
    if ctx.attempt == 1:
        os._exit(3)


@handler("fault.timeout", timeout="1s", max_attempts=2)
def overruns_its_timeout(ctx: Any, payload: Any) -> None:
    """Runs past its 1 s timeout; notes whether it was told through ctx.cancelled."""
    record(ctx)
    told = ctx.cancelled.wait(float(payload.get("seconds", 10)))
    record(ctx, "cancelled" if told else "returned")


@handler("fault.stuck", timeout="1s", max_attempts=1)
def stuck(ctx: Any, payload: Any) -> None:
    """Never looks at ctx.cancelled: a thread lost for good to the tick."""
    record(ctx)
    time.sleep(float(payload.get("seconds", 600)))


class OddBaseException(BaseException):
    """Not an Exception at all: what a careless library might raise."""


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be shown")


def _recurse(depth: int) -> int:
    return _recurse(depth + 1) + 1


async def _coroutine() -> None:
    return None


@handler("fault.odd", max_attempts=1)
def odd(ctx: Any, payload: Any) -> Any:
    """Misbehaves as `payload["do"]` says; none of it may take the tick down."""
    record(ctx)
    do = payload["do"]
    if do == "recursion":
        return _recurse(0)
    if do == "memory":
        raise MemoryError
    if do == "exit":
        raise SystemExit(3)
    if do == "interrupt":
        raise KeyboardInterrupt
    if do == "base":
        raise OddBaseException("not an Exception")
    if do == "unprintable":
        raise Unprintable
    if do == "nul":
        raise ValueError("bad\x00byte and half a surrogate \udcff")
    if do == "garbage":
        return object()
    if do == "async":
        return _coroutine()
    if do == "huge-message":
        raise ValueError("x" * 5_000_000)
    return payload["no such key"]


@handler("fault.fail", backoff="15s")
def fail(ctx: Any, payload: Any) -> None:
    record(ctx)
    raise RuntimeError("failing on purpose")


@handler("fault.echo")
def echo(ctx: Any, payload: Any) -> None:
    """Records the payload's text as hex, to compare it byte for byte across environments."""
    record(ctx, str(payload.get("text", "")).encode("utf-8").hex() or "-")


@handler("fault.effect", max_attempts=50)
def effect(ctx: Any, payload: Any) -> None:
    """A business effect guarded by ctx.once, committed with the run's success (chaos tests).

    The attempt budget is one no series of kills, stalls and restarts in a test can use up.
    """
    record(ctx)
    if ctx.once(payload["key"]):
        ctx.db.execute(
            "INSERT INTO effect_rows (key, run_id, attempt) VALUES (%s, %s, %s)",
            (payload["key"], ctx.run_id, ctx.attempt),
        )
    time.sleep(float(payload.get("ms", 20)) / 1000)
