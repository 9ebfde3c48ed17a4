"""Whether a tick has anything to do, asked before the tick machinery is imported."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from cronjob.queries import TICK_WORK_EXISTS


def work_waiting(conn: Any, job_types: Iterable[str], *, now: datetime | None = None) -> bool:
    """True if a run of `job_types` is due, a lease expired, or a schedule is due."""
    row = conn.execute(TICK_WORK_EXISTS, {"job_types": list(job_types), "now": now}).fetchone()
    return bool(row[0])
