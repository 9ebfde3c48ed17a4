"""One function per statement of cronjob.queries.dependencies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cronjob.errors import BadInput
from cronjob.queries import dependencies as queries

# The most unknown ids an error names.
NAMED_AT_MOST = 10
# The runs `show` and the dashboard list on each side of a run's dependencies (a run may be
# waited for by thousands); they count the rest.
LISTED_AT_MOST = 20


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


@dataclass(frozen=True)
class RunDependencies:
    """The runs a run waits for (`parent`) and those that wait for it (`child`): the first
    few of each, (id, status, policy) by id, and how many there are in all."""

    parent: list[tuple[int, str, str]]
    child: list[tuple[int, str, str]]
    parents: int
    children: int

    @property
    def more_parents(self) -> int:
        return self.parents - len(self.parent)

    @property
    def more_children(self) -> int:
        return self.children - len(self.child)


def dependencies_get(conn: Any, run_id: int, *, limit: int = LISTED_AT_MOST) -> RunDependencies:
    """The first `limit` runs (by id) run `run_id` waits for, and that wait for it."""
    found: dict[str, list[tuple[int, str, str]]] = {"parent": [], "child": []}
    params = {"id": run_id, "limit": limit}
    for side, id_, status, policy in conn.execute(queries.DEPENDENCIES_GET, params):
        found[side].append((int(id_), str(status), str(policy)))
    parents, children = dependencies_count(conn, run_id)
    return RunDependencies(found["parent"], found["child"], parents, children)


def dependencies_count(conn: Any, run_id: int) -> tuple[int, int]:
    """How many runs `run_id` waits for, and how many wait for it."""
    parents, children = conn.execute(queries.DEPENDENCIES_COUNT, {"id": run_id}).fetchone()
    return int(parents), int(children)
