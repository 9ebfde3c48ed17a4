"""Django's Tasks backend (cronjob.django): the task types waiting, a task's return value
and its result (by run id, or by the result id Django's get_result is given). The
statements are queries.tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from cronjob.queries import tasks as queries


def task_types_waiting(conn: Any, queues: Sequence[str] | None) -> list[str]:
    """The task types with runs waiting, in `queues` (any queue if None)."""
    rows = conn.execute(queries.TASK_TYPES_WAITING, {"queues": queues}).fetchall()
    return [row[0] for row in rows]


def task_return_value_set(conn: Any, run_id: int, lease_token: UUID, value_json: str) -> bool:
    """Write what the task returned in the handler's transaction; False if the lease is gone."""
    params = {"value": value_json, "id": run_id, "token": lease_token}
    return conn.execute(queries.TASK_RETURN_VALUE_SET, params).rowcount == 1


async def task_return_value_set_async(
    conn: Any, run_id: int, lease_token: UUID, value_json: str
) -> bool:
    params = {"value": value_json, "id": run_id, "token": lease_token}
    cursor = await conn.execute(queries.TASK_RETURN_VALUE_SET, params)
    return cursor.rowcount == 1


def task_result_get(conn: Any, run_id: int) -> dict[str, Any] | None:
    """One task run with its failed attempts (a list of dicts), or None."""
    return (
        conn.cursor(row_factory=dict_row)
        .execute(queries.TASK_RESULT_GET, {"id": run_id})
        .fetchone()
    )


async def task_result_get_async(conn: Any, run_id: int) -> dict[str, Any] | None:
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute(queries.TASK_RESULT_GET, {"id": run_id})
    return await cursor.fetchone()


def task_result_get_by_result_id(conn: Any, result_id: UUID) -> dict[str, Any] | None:
    """The task run whose result id is `result_id`, as task_result_get reads it, or None."""
    return (
        conn.cursor(row_factory=dict_row)
        .execute(queries.TASK_RESULT_GET_BY_RESULT_ID, {"result_id": result_id})
        .fetchone()
    )
