"""Handlers used by the tests' real `jobrunner tick` processes.

Each execution appends "<run id> <attempt> <pid>" to the file named by
JOBRUNNER_TEST_EXEC_LOG: a record kept outside the database, so tests can count
executions independently of what the database says.
"""

from __future__ import annotations

import time
from typing import Any

from cronjob import Backoff, Fail, Retry, handler
from tests.exec_log import record


@handler("test.ok")
def ok(ctx: Any, payload: Any) -> None:
    record(ctx)


@handler("test.sleep", lease="30s")
def sleep(ctx: Any, payload: Any) -> None:
    record(ctx)
    deadline = time.monotonic() + float(payload.get("seconds", 1))
    while time.monotonic() < deadline and not ctx.cancelled.is_set():
        time.sleep(0.02)


@handler("test.fail", max_attempts=3)
def fail(ctx: Any, payload: Any) -> None:
    record(ctx)
    raise RuntimeError(payload.get("message", "boom"))


# Its backoff is far from the default (15 s, capped at an hour): a test can tell them apart.
@handler("test.fail_slowly", max_attempts=4, backoff=Backoff(base=100, cap=300))
def fail_slowly(ctx: Any, payload: Any) -> None:
    record(ctx)
    raise RuntimeError("still failing")


@handler("test.retry_in")
def retry_in(ctx: Any, payload: Any) -> None:
    record(ctx)
    raise Retry(delay=payload.get("delay", "10m"))


@handler("test.give_up")
def give_up(ctx: Any, payload: Any) -> None:
    record(ctx)
    raise Fail("permanently broken")


@handler("test.db_then_wait")
def db_then_wait(ctx: Any, payload: Any) -> None:
    ctx.db.execute("SELECT 1")
    time.sleep(float(payload.get("seconds", 0.3)))
