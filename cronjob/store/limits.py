"""Job type limits, as models. The statements are queries.limits."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg.rows import class_row

from cronjob.models import TypeLimit
from cronjob.queries import limits as queries


def job_type_limits_list(conn: Any) -> list[TypeLimit]:
    cursor = conn.cursor(row_factory=class_row(TypeLimit))
    return cursor.execute(queries.JOB_TYPE_LIMITS_LIST).fetchall()


def job_type_limit_set(
    conn: Any, limit: TypeLimit, *, actor: str, now: datetime | None = None
) -> TypeLimit:
    """Set `limit` on its job type, replacing any it had; returns it as stored."""
    params = {
        "job_type": limit.job_type,
        "concurrency": limit.concurrency,
        "rate": limit.rate,
        "rate_period": limit.rate_period,
        "per": limit.per,
        "per_field": limit.per_field,
        "reason": limit.reason,
        "actor": actor,
        "now": now,
    }
    cursor = conn.cursor(row_factory=class_row(TypeLimit))
    return cursor.execute(queries.JOB_TYPE_LIMIT_SET, params).fetchone()


def job_type_limit_clear(conn: Any, job_type: str) -> TypeLimit | None:
    """Clear the limit of `job_type`; returns it, or None if it had none."""
    cursor = conn.cursor(row_factory=class_row(TypeLimit))
    return cursor.execute(queries.JOB_TYPE_LIMIT_CLEAR, {"job_type": job_type}).fetchone()


def job_type_limits_throttled(conn: Any, *, now: datetime | None = None) -> dict[str, int]:
    """Each limited job type, with how many of its runs are due and waiting."""
    rows = conn.execute(queries.JOB_TYPE_LIMITS_THROTTLED, {"now": now}).fetchall()
    return {job_type: int(due) for job_type, due in rows}


def job_type_limit_get_for_run(
    conn: Any, run_id: int, *, now: datetime | None = None
) -> TypeLimit | None:
    """The limit holding the run `run_id` back: its type's, if the run is due and waiting."""
    row = conn.execute(queries.JOB_TYPE_LIMIT_GET_FOR_RUN, {"id": run_id, "now": now}).fetchone()
    if row is None or not row[-1]:
        return None
    return TypeLimit(*row[:-1])
