"""One function per statement of cronjob.queries.dependencies."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from cronjob.errors import BadInput
from cronjob.queries import dependencies as queries

# The most unknown ids an error names.
NAMED_AT_MOST = 10


def _refusal(unknown: list[int]) -> BadInput:
    named = ", ".join(map(str, unknown[:NAMED_AT_MOST]))
    more = f" and {len(unknown) - NAMED_AT_MOST} more" if len(unknown) > NAMED_AT_MOST else ""
    return BadInput(f"no run with id {named}{more} to wait for (after)")


def dependencies_list_unknown(conn: Any, ids: Sequence[int]) -> None:
    """Raise BadInput naming the ids that name no run, if any."""
    unknown = conn.execute(queries.DEPENDENCIES_LIST_UNKNOWN, {"ids": list(ids)}).fetchone()[0]
    if unknown:
        raise _refusal(list(unknown))


async def dependencies_list_unknown_async(conn: Any, ids: Sequence[int]) -> None:
    cursor = await conn.execute(queries.DEPENDENCIES_LIST_UNKNOWN, {"ids": list(ids)})
    unknown = (await cursor.fetchone())[0]
    if unknown:
        raise _refusal(list(unknown))


def _edges(edges: Sequence[tuple[int, int, str]], now: datetime | None) -> dict[str, Any]:
    return {
        "runs": [run for run, _, _ in edges],
        "parents": [parent for _, parent, _ in edges],
        "policies": [policy for _, _, policy in edges],
        "now": now,
    }


def dependencies_insert_many(
    conn: Any, edges: Sequence[tuple[int, int, str]], *, now: datetime | None = None
) -> None:
    """Make each run wait for its parent: edges (run id, parent id, policy)."""
    conn.execute(queries.DEPENDENCIES_INSERT_MANY, _edges(edges, now))


async def dependencies_insert_many_async(
    conn: Any, edges: Sequence[tuple[int, int, str]], *, now: datetime | None = None
) -> None:
    await conn.execute(queries.DEPENDENCIES_INSERT_MANY, _edges(edges, now))


def dependencies_get(conn: Any, run_id: int) -> dict[str, list[tuple[int, str, str]]]:
    """The runs run `run_id` waits for ('parent') and those that wait for it ('child'): each
    (id, status, policy), by id."""
    found: dict[str, list[tuple[int, str, str]]] = {"parent": [], "child": []}
    for side, id_, status, policy in conn.execute(queries.DEPENDENCIES_GET, {"id": run_id}):
        found[side].append((int(id_), str(status), str(policy)))
    return found
