"""Handlers for the batch tests' real `jobrunner tick` processes.

Each execution appends a line to the file named by JOBRUNNER_TEST_EXEC_LOG, one O_APPEND
write a line, with the wall clock: "start|end <run id> <attempt> <pid> <unix time>" for a
member, "callback <run id> <attempt> <pid> <unix time> <ctx.batch as JSON>" for a callback.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from cronjob import Fail, handler


def _log(*words: Any) -> None:
    path = os.environ.get("JOBRUNNER_TEST_EXEC_LOG")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (" ".join(map(str, words)) + "\n").encode())
    finally:
        os.close(fd)


# A short lease: the runs of a tick killed mid-run are rescued within seconds.
@handler("batch.member", lease="2s", max_attempts=3)
def member(ctx: Any, payload: Any) -> None:
    _log("start", ctx.run_id, ctx.attempt, os.getpid(), repr(time.time()))
    if payload.get("kill") and ctx.attempt == 1:
        # The tick dies here, with this run and the others it holds in flight.
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(payload.get("seconds", 0)))
    if payload.get("fail"):
        _log("end", ctx.run_id, ctx.attempt, os.getpid(), repr(time.time()))
        raise Fail("this member gives up")
    _log("end", ctx.run_id, ctx.attempt, os.getpid(), repr(time.time()))


@handler("batch.summary")
def summary(ctx: Any, payload: Any) -> None:
    batch = ctx.batch
    seen = {
        "id": batch.id,
        "counts": batch.counts,
        "not_succeeded": batch.not_succeeded,
        "scheduled_for": batch.scheduled_for.isoformat() if batch.scheduled_for else None,
        "started_at": batch.started_at.isoformat(),
        "ended_at": batch.ended_at.isoformat(),
        "payload": payload,
    }
    _log("callback", ctx.run_id, ctx.attempt, os.getpid(), repr(time.time()), json.dumps(seen))
