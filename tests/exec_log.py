"""The execution log test handlers append to: a record kept outside the database."""

from __future__ import annotations

import os
from typing import Any


def record(ctx: Any, event: str | None = None) -> None:
    """Append "<run id> <attempt> <pid>[ <event>]" to $JOBRUNNER_TEST_EXEC_LOG, if set."""
    path = os.environ.get("JOBRUNNER_TEST_EXEC_LOG")
    if not path:
        return
    words = [str(ctx.run_id), str(ctx.attempt), str(os.getpid()), *([event] if event else [])]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(
            fd, (" ".join(words) + "\n").encode()
        )  # one O_APPEND write: lines never interleave
    finally:
        os.close(fd)
