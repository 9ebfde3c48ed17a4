"""A slow scheduled handler that notices, outside the database, when it overlaps itself.

Each execution holds a guard file for its schedule and tenant while it runs; finding one
held by a live process means two runs of the same schedule ran at once, and is recorded as
"overlap" in the execution log. The handler then waits until the test creates a release
file named after the run (`release-<run id>`) in the same directory, so a test decides when
a run is done. A guard left by a killed process is taken over.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from cronjob import handler
from tests import exec_log


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _take_guard(guard: Path) -> bool:
    """Create the guard; False if a live process holds it."""
    while True:
        try:
            fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                holder = int(guard.read_text() or "0")
            except (FileNotFoundError, ValueError):
                continue
            if holder and _alive(holder):
                return False
            guard.unlink(missing_ok=True)
            continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True


@handler("overlap.slow", lease="5m", max_attempts=3)
def slow(ctx: Any, payload: Any) -> None:
    folder = Path(os.environ["JOBRUNNER_TEST_OVERLAP_DIR"])
    guard = folder / f"{ctx.tenant_id or 'global'}.running"
    if not _take_guard(guard):
        exec_log.record(ctx, "overlap")
        return
    exec_log.record(ctx, "run")
    try:
        release = folder / f"release-{ctx.run_id}"
        until = time.monotonic() + 60
        while not release.exists() and time.monotonic() < until:
            time.sleep(0.02)
        if payload.get("fail"):
            raise RuntimeError("this run fails")
    finally:
        guard.unlink(missing_ok=True)
