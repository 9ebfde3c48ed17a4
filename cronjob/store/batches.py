"""One function per statement of cronjob.queries.batches."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from cronjob.models import BatchState
from cronjob.queries import batches as queries
from cronjob.run_options import NewRun


def _batch_params(batch_id: int, then: NewRun, on: str, now: datetime | None) -> dict[str, Any]:
    return {
        "id": batch_id,
        "on_outcome": on,
        "then_type": then.job_type,
        "then_payload": then.payload_json,
        "then_tenant_id": then.options.get("tenant_id"),
        "then_priority": then.options.get("priority"),
        "then_max_attempts": then.options.get("max_attempts"),
        "now": now,
    }


def batch_insert(conn: Any, then: NewRun, on: str, *, now: datetime | None = None) -> int:
    """Make a batch whose callback is `then`; returns its id."""
    batch_id = conn.execute(queries.BATCH_INSERT_ID).fetchone()[0]
    conn.execute(queries.BATCH_INSERT, _batch_params(batch_id, then, on, now))
    return int(batch_id)


async def batch_insert_async(
    conn: Any, then: NewRun, on: str, *, now: datetime | None = None
) -> int:
    batch_id = (await (await conn.execute(queries.BATCH_INSERT_ID)).fetchone())[0]
    await conn.execute(queries.BATCH_INSERT, _batch_params(batch_id, then, on, now))
    return int(batch_id)


def batch_end(conn: Any, batch_id: int, *, now: datetime | None = None) -> int | None:
    """End the batch if all its members have ended; returns its callback's id, if enqueued."""
    return conn.execute(queries.BATCH_END, {"id": batch_id, "now": now}).fetchone()[0]


async def batch_end_async(conn: Any, batch_id: int, *, now: datetime | None = None) -> int | None:
    return (await (await conn.execute(queries.BATCH_END, {"id": batch_id, "now": now})).fetchone())[
        0
    ]


def batches_insert_for_occurrences(
    conn: Any, definition: Any, scheduled_fors: Sequence[datetime], *, now: datetime | None
) -> list[int]:
    """Make the batch of each occurrence of `definition` (a DueDefinition with a then_type)
    that has none yet; returns their ids."""
    params = {
        "then_type": definition.then_type,
        "name": definition.name,
        "definition_id": definition.id,
        "scheduled_fors": list(scheduled_fors),
        "now": now,
    }
    return [row[0] for row in conn.execute(queries.BATCHES_INSERT_FOR_OCCURRENCES, params)]


def _state(row: dict[str, Any], *, live: bool) -> BatchState:
    counts = row.pop("live_counts", None) if live else row.get("counts")
    row.pop("live_counts", None)
    row.pop("counts", None)
    return BatchState(
        started_at=row.pop("created_at"),
        counts={str(k): int(v) for k, v in (counts or {}).items()},
        not_succeeded=list(row.pop("not_succeeded") or []),
        **row,
    )


def batch_get_by_callback(conn: Any, run_id: int) -> BatchState | None:
    """The batch whose callback is run `run_id`, as it was when the callback was enqueued."""
    cursor = conn.cursor(row_factory=dict_row)
    row = cursor.execute(queries.BATCH_GET_BY_CALLBACK, {"run_id": run_id}).fetchone()
    return None if row is None else _state(row, live=False)


def batch_get_id_by_member(conn: Any, run_id: int) -> int | None:
    """The batch run `run_id` is a member of, if any."""
    row = conn.execute(queries.BATCH_GET_ID_BY_MEMBER, {"run_id": run_id}).fetchone()
    return None if row is None else row[0]


def batch_get(conn: Any, batch_id: int) -> BatchState | None:
    """A batch with its members' statuses as they are now."""
    row = conn.cursor(row_factory=dict_row).execute(queries.BATCH_GET, {"id": batch_id}).fetchone()
    return None if row is None else _state(row, live=True)


def batches_list(conn: Any, *, limit: int = 50) -> list[BatchState]:
    """The newest batches first, with their members' statuses as they are now."""
    rows = conn.cursor(row_factory=dict_row).execute(queries.BATCHES_LIST, {"limit": limit})
    return [_state(row, live=True) for row in rows.fetchall()]


def batch_members_list(
    conn: Any, batch_id: int, *, statuses: list[str] | None = None, limit: int = 1000
) -> list[tuple[int, str]]:
    """A batch's members (id, status) by id, of the statuses given (all: None)."""
    params = {"id": batch_id, "statuses": statuses, "limit": limit}
    return [(int(i), str(s)) for i, s in conn.execute(queries.BATCH_MEMBERS_LIST, params)]


def batches_prune(conn: Any, *, older_than: float, now: datetime | None = None) -> int:
    """Delete the batches that ended more than `older_than` seconds ago and have no member
    left; returns how many."""
    return conn.execute(queries.BATCHES_PRUNE, {"older_than": older_than, "now": now}).rowcount
