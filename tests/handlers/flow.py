"""Handlers for the flow-control tests' real `jobrunner tick` processes.

Each run appends "start|end <run id> <attempt> <pid> <tenant> <key> <unix time>" to the file
named by JOBRUNNER_TEST_EXEC_LOG, one O_APPEND write a line: a record of what ran when, kept
outside the database, from which a test counts the runs in flight at every instant.
"""

from __future__ import annotations

import os
import time
from typing import Any

from cronjob import handler


def _log(ctx: Any, payload: Any, event: str) -> None:
    path = os.environ.get("JOBRUNNER_TEST_EXEC_LOG")
    if not path:
        return
    key = str(payload.get("account", "-"))
    words = [
        event,
        str(ctx.run_id),
        str(ctx.attempt),
        str(os.getpid()),
        ctx.tenant_id or "-",
        key,
        repr(time.time()),
    ]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (" ".join(words) + "\n").encode())
    finally:
        os.close(fd)


# A short lease: a run of a tick killed mid-run frees its place within seconds.
@handler("flow.work", lease="2s")
def work(ctx: Any, payload: Any) -> None:
    _log(ctx, payload, "start")
    time.sleep(float(payload.get("seconds", 0.1)))
    _log(ctx, payload, "end")
