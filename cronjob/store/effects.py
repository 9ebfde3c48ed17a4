"""The effects ledger, as the handler's context uses it. The statements are
queries.effects.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from cronjob.models import ClaimedRun
from cronjob.queries import effects as queries


def effect_insert_once(conn: Any, key: str, run: ClaimedRun) -> bool:
    """Record `key` in the caller's transaction; True if it was not recorded yet."""
    row = conn.execute(
        queries.EFFECT_INSERT_ONCE, {"key": key, "run_id": run.id, "attempt": run.attempt}
    ).fetchone()
    return row is not None


async def effect_insert_once_async(conn: Any, key: str, run: ClaimedRun) -> bool:
    params = {"key": key, "run_id": run.id, "attempt": run.attempt}
    return (await (await conn.execute(queries.EFFECT_INSERT_ONCE, params)).fetchone()) is not None


def effect_insert_at_most_once(conn: Any, key: str, run: ClaimedRun) -> tuple[bool, bool]:
    """Record `key` for `run` if it still holds its lease: (lease held, newly recorded)."""
    held, recorded = conn.execute(
        queries.EFFECT_INSERT_AT_MOST_ONCE,
        {"key": key, "run_id": run.id, "token": run.lease_token},
    ).fetchone()
    return bool(held), bool(recorded)


async def effect_insert_at_most_once_async(
    conn: Any, key: str, run: ClaimedRun
) -> tuple[bool, bool]:
    params = {"key": key, "run_id": run.id, "token": run.lease_token}
    held, recorded = await (
        await conn.execute(queries.EFFECT_INSERT_AT_MOST_ONCE, params)
    ).fetchone()
    return bool(held), bool(recorded)


def effects_prune_many(
    conn: Any,
    *,
    older_than_seconds: float = 0.0,
    batch_size: int,
    now: datetime | None = None,
) -> int:
    """Delete ledger keys whose run is gone and that are older than `older_than_seconds`.

    Works in batches of `batch_size` keys, one statement each (on an autocommit
    connection, each batch commits on its own, so locks stay short). Returns how
    many keys were deleted. Keys whose run still exists are never deleted.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    params = {"older_than": float(older_than_seconds), "limit": batch_size, "now": now}
    total = 0
    while True:
        deleted = conn.execute(queries.EFFECTS_PRUNE_MANY, params).rowcount
        total += deleted
        if deleted < batch_size:
            return total
