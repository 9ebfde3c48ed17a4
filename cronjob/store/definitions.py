"""Schedules, as models: definitions, materializing their runs, health, pings, skips and
the sync lock. The statements are queries.definitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg.rows import RowFactory, class_row, kwargs_row

from cronjob.models import (
    Advance,
    Definition,
    DefinitionSchedule,
    DefinitionSpec,
    DueDefinition,
    PingTarget,
    ScheduleHealthRow,
    ScheduleSkip,
    Status,
)
from cronjob.queries import definitions as queries
from cronjob.store.preflight import advisory_lock

if TYPE_CHECKING:
    from collections.abc import Callable

_T = TypeVar("_T")


def _with_status(model: Callable[..., _T]) -> RowFactory[_T]:
    """Rows of a model whose `status` column is a Status."""

    def build(*, status: str, **columns: Any) -> _T:
        return model(status=Status(status), **columns)

    return kwargs_row(build)


@dataclass(frozen=True)
class DefinitionRun:
    """A run of a definition, as `schedule show` lists it."""

    id: int
    tenant_id: str | None
    scheduled_for: datetime | None
    status: Status
    attempts: int


_DEFINITION = class_row(Definition)


def definition_insert(
    conn: Any,
    spec: DefinitionSpec,
    *,
    enabled: bool,
    now: datetime,
    next_fire_at: datetime | None,
) -> Definition | None:
    """Insert a definition starting at `now`; None when the name is taken."""
    params = {**_spec_params(spec), "enabled": enabled, "now": now, "next_fire_at": next_fire_at}
    return (
        conn.cursor(row_factory=_DEFINITION).execute(queries.DEFINITION_INSERT, params).fetchone()
    )


def definition_update(
    conn: Any,
    definition_id: int,
    spec: DefinitionSpec,
    *,
    enabled: bool,
    now: datetime,
    materialized_through: datetime,
    next_fire_at: datetime | None,
) -> Definition:
    timing = _timing(enabled, now, materialized_through, next_fire_at)
    params = {**_spec_params(spec), "id": definition_id, **timing}
    return _definition(conn, queries.DEFINITION_UPDATE, params)


def definition_set_enabled(
    conn: Any,
    definition_id: int,
    enabled: bool,
    *,
    now: datetime,
    materialized_through: datetime,
    next_fire_at: datetime | None,
) -> Definition:
    timing = _timing(enabled, now, materialized_through, next_fire_at)
    return _definition(conn, queries.DEFINITION_SET_ENABLED, {"id": definition_id, **timing})


def _timing(
    enabled: bool, now: datetime, materialized_through: datetime, next_fire_at: datetime | None
) -> dict[str, Any]:
    return {
        "enabled": enabled,
        "now": now,
        "materialized_through": materialized_through,
        "next_fire_at": next_fire_at,
    }


def _definition(conn: Any, sql: str, params: dict[str, Any]) -> Definition:
    """The one definition `sql` writes and returns."""
    return conn.cursor(row_factory=_DEFINITION).execute(sql, params).fetchone()


def _spec_params(spec: DefinitionSpec) -> dict[str, Any]:
    import json

    return {
        "name": spec.name,
        "job_type": spec.job_type,
        "payload": json.dumps(spec.payload),
        "schedule": spec.schedule,
        "timezone": spec.timezone,
        "scope": spec.scope,
        "max_attempts": spec.max_attempts,
        "priority": spec.priority,
        "catch_up": spec.catch_up,
        "catch_up_limit": spec.catch_up_limit,
        "overlap": spec.overlap,
        "expect_within": spec.expect_within,
        "ping_url": spec.ping_url,
        "ping_failure_url": spec.ping_failure_url,
        "then_type": spec.then_type,
    }


def definition_get(conn: Any, name: str, *, lock: bool = False) -> Definition | None:
    sql = queries.DEFINITION_GET_FOR_UPDATE if lock else queries.DEFINITION_GET
    return conn.cursor(row_factory=_DEFINITION).execute(sql, {"name": name}).fetchone()


def definitions_list(conn: Any, *, lock: bool = False) -> list[Definition]:
    sql = queries.DEFINITIONS_LIST_FOR_UPDATE if lock else queries.DEFINITIONS_LIST
    return conn.cursor(row_factory=_DEFINITION).execute(sql).fetchall()


def definitions_list_schedules(conn: Any) -> list[DefinitionSchedule]:
    cursor = conn.cursor(row_factory=class_row(DefinitionSchedule))
    return cursor.execute(queries.DEFINITIONS_LIST_SCHEDULES).fetchall()


def definition_delete(conn: Any, definition_id: int) -> None:
    conn.execute(queries.DEFINITION_DELETE, {"id": definition_id})


def definition_runs_count_by_status(conn: Any, definition_id: int) -> dict[Status, int]:
    rows = conn.execute(queries.DEFINITION_RUNS_COUNT_BY_STATUS, {"id": definition_id}).fetchall()
    return {Status(status): number for status, number in rows}


def definition_runs_count_latest_occurrence(
    conn: Any, definition_id: int
) -> tuple[datetime | None, dict[Status, int]]:
    """The newest occurrence that has runs, and its runs counted by status."""
    rows = conn.execute(
        queries.DEFINITION_RUNS_COUNT_LATEST_OCCURRENCE, {"id": definition_id}
    ).fetchall()
    return (rows[0][0] if rows else None), {Status(status): n for _, status, n in rows}


def definition_runs_list_recent(
    conn: Any, definition_id: int, *, limit: int
) -> list[DefinitionRun]:
    cursor = conn.cursor(row_factory=_with_status(DefinitionRun))
    params = {"id": definition_id, "limit": limit}
    return cursor.execute(queries.DEFINITION_RUNS_LIST_RECENT, params).fetchall()


def definitions_due_exists(conn: Any, *, now: datetime | None = None) -> tuple[datetime, bool]:
    """The clock this tick materializes by, and whether any definition is due by it."""
    clock, due = conn.execute(queries.DEFINITIONS_DUE_EXISTS, {"now": now}).fetchone()
    return clock, due


def definitions_claim_due_many(
    conn: Any,
    *,
    now: datetime,
    limit: int,
    skip: Sequence[int] = (),
    only: Sequence[int] | None = None,
) -> list[DueDefinition]:
    """Lock up to `limit` due definitions no other tick holds, among `only` if given;
    call inside a transaction."""
    cursor = conn.cursor(row_factory=class_row(DueDefinition))
    params = {
        "now": now,
        "limit": limit,
        "skip": list(skip),
        "only": None if only is None else list(only),
    }
    return cursor.execute(queries.DEFINITIONS_CLAIM_DUE_MANY, params).fetchall()


def runs_materialize_many(
    conn: Any, advances: Sequence[Advance], *, global_runs: Sequence[Advance], now: datetime
) -> int:
    """Create the runs of `global_runs` and move every advance's high-water mark; one statement.

    Returns the number of runs created (occurrences that already had a run are skipped).
    """
    run_definition_ids: list[int] = []
    scheduled_fors: list[datetime] = []
    for advance in global_runs:
        run_definition_ids.extend([advance.definition.id] * len(advance.scheduled_fors))
        scheduled_fors.extend(advance.scheduled_fors)
    created, _ = conn.execute(
        queries.RUNS_MATERIALIZE_MANY,
        {
            "run_definition_ids": run_definition_ids,
            "scheduled_fors": scheduled_fors,
            "ids": [a.definition.id for a in advances],
            "throughs": [a.materialized_through for a in advances],
            "next_fire_ats": [a.next_fire_at for a in advances],
            "now": now,
        },
    ).fetchone()
    return int(created)


def runs_materialize_tenants(
    conn: Any, advance: Advance, *, tenants_sql: str, now: datetime
) -> int:
    """Create one run per tenant and occurrence of a tenant-scoped definition.

    Call while holding the definition's row lock (as materializing does).
    """
    params = {
        "id": advance.definition.id,
        "scheduled_fors": list(advance.scheduled_fors),
        "now": now,
    }
    first = not conn.execute(queries.RUNS_MATERIALIZE_TENANTS_OCCURRENCES_EXIST, params).fetchone()[
        0
    ]
    template = queries.RUNS_MATERIALIZE_TENANTS_FIRST if first else queries.RUNS_MATERIALIZE_TENANTS
    # The tenant query is the operator's own SQL: `%` in it must not read as a placeholder.
    sql = template.replace("{tenants_sql}", tenants_sql.replace("%", "%%"))
    return conn.execute(sql, params).rowcount


SKIPS_KEPT = 1000  # recorded skips kept per definition, the newest

# Room per schedule and tenant for unfinished runs under each overlap policy.
_OVERLAP_CAPACITY = {"skip": 1, "queue": 2}
_OVERLAP_REASON = {
    "skip": "overlap skip: the previous run had not finished",
    "queue": "overlap queue: a run was already waiting behind the unfinished one",
}


def runs_materialize_exclusive(
    conn: Any, advance: Advance, *, tenants_sql: str | None, now: datetime
) -> tuple[int, int]:
    """Create the runs of a definition under overlap policy skip or queue; record the rest.

    Global when `tenants_sql` is None, else one key per tenant. Returns (created, skipped).
    Call while holding the definition's row lock (as materializing does).
    """
    policy = advance.definition.overlap
    if tenants_sql is None:
        keys = queries.RUNS_MATERIALIZE_EXCLUSIVE_GLOBAL_KEYS
    else:
        # The tenant query is the operator's own SQL: `%` in it must not read as a placeholder.
        keys = queries.RUNS_MATERIALIZE_EXCLUSIVE_TENANT_KEYS.replace(
            "{tenants_sql}", tenants_sql.replace("%", "%%")
        )
    params = {
        "id": advance.definition.id,
        "scheduled_fors": list(advance.scheduled_fors),
        "capacity": _OVERLAP_CAPACITY[policy],
        "reason": _OVERLAP_REASON[policy],
        "keep": SKIPS_KEPT,
        "now": now,
    }
    sql = queries.RUNS_MATERIALIZE_EXCLUSIVE.replace("{keys_sql}", keys)
    created, skipped, _, _ = conn.execute(sql, params).fetchone()
    return int(created), int(skipped)


def definitions_list_ping_targets(conn: Any) -> dict[int, PingTarget]:
    cursor = conn.cursor(row_factory=class_row(PingTarget))
    return {t.definition_id: t for t in cursor.execute(queries.DEFINITIONS_LIST_PING_TARGETS)}


def definitions_list_health(conn: Any, *, now: datetime | None = None) -> list[ScheduleHealthRow]:
    cursor = conn.cursor(row_factory=class_row(ScheduleHealthRow))
    return cursor.execute(queries.DEFINITIONS_LIST_HEALTH, {"now": now}).fetchall()


def definition_get_health(
    conn: Any, definition_id: int, *, now: datetime | None = None
) -> ScheduleHealthRow | None:
    cursor = conn.cursor(row_factory=class_row(ScheduleHealthRow))
    params = {"id": definition_id, "now": now}
    return cursor.execute(queries.DEFINITION_GET_HEALTH, params).fetchone()


def definition_skips_list_recent(
    conn: Any, definition_id: int, *, limit: int
) -> list[ScheduleSkip]:
    cursor = conn.cursor(row_factory=class_row(ScheduleSkip))
    params = {"id": definition_id, "limit": limit}
    return cursor.execute(queries.DEFINITION_SKIPS_LIST_RECENT, params).fetchall()


def definitions_lock_for_sync(conn: Any, *, wait: bool = True) -> bool:
    """Take the sync lock, held until this transaction ends; with `wait`, queue for any other
    `schedule sync` to finish, else return False at once if one holds it."""
    return advisory_lock(
        conn, queries.DEFINITIONS_LOCK_FOR_SYNC, queries.DEFINITIONS_LOCK_FOR_SYNC_TRY, wait=wait
    )
