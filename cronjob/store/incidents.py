"""An operator acting on sets of runs: selections counted, retried, cancelled or pruned a
batch at a time, paused job types, and the audit trail. The statements are
queries.incidents.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg.rows import class_row

from cronjob.models import AuditEntry, BatchResult, Selection, SelectionCount, TypePause
from cronjob.queries import incidents as queries

AUDIT_SAMPLE = 10  # ids kept in an audit row, and shown by a dry run


def _selection_params(
    selection: Selection, eligible: Sequence[str], now: datetime | None
) -> dict[str, Any]:
    def listed(values: tuple[Any, ...] | None) -> list[Any] | None:
        return None if values is None else list(values)

    return {
        "eligible": list(eligible),
        "ids": listed(selection.ids),
        "statuses": listed(selection.statuses),
        "job_types": listed(selection.job_types),
        "tenants": listed(selection.tenants),
        "error_types": listed(selection.error_types),
        "error_like": selection.error_like,
        "definition_id": selection.definition_id,
        "batch_id": selection.batch_id,
        "since": selection.since,
        "until": selection.until,
        "now": now,
    }


def runs_count_selected(
    conn: Any, selection: Selection, *, eligible: Sequence[str], now: datetime | None = None
) -> SelectionCount:
    """How many runs of `selection` the command may act on, by status, with a sample of ids."""
    params = {
        **_selection_params(selection, eligible, now),
        "limit": selection.limit,
        "sample": AUDIT_SAMPLE,
    }
    rows = conn.execute(queries.RUNS_COUNT_SELECTED, params).fetchall()
    sample = sorted(i for _, _, ids in rows for i in ids)[:AUDIT_SAMPLE]
    return SelectionCount({status: n for status, n, _ in rows}, tuple(sample))


def _selected_batch(
    conn: Any,
    sql: str,
    selection: Selection,
    *,
    eligible: Sequence[str],
    after: int,
    limit: int,
    now: datetime | None = None,
) -> BatchResult:
    params = {**_selection_params(selection, eligible, now), "after": after, "limit": limit}
    last_id, ids, statuses = conn.execute(sql, params).fetchone()
    return BatchResult(last_id, tuple(ids), tuple(statuses))


def runs_retry_selected(conn: Any, selection: Selection, **batch: Any) -> BatchResult:
    """Retry the next `limit` runs of `selection` with an id above `after` (`batch`: the
    keywords of `_selected_batch`)."""
    return _selected_batch(conn, queries.RUNS_RETRY_SELECTED, selection, **batch)


def runs_cancel_selected(conn: Any, selection: Selection, **batch: Any) -> BatchResult:
    """Cancel the next `limit` runs of `selection` with an id above `after` (`batch`: the
    keywords of `_selected_batch`)."""
    return _selected_batch(conn, queries.RUNS_CANCEL_SELECTED, selection, **batch)


def runs_prune_selected(conn: Any, selection: Selection, **batch: Any) -> BatchResult:
    """Delete the next `limit` runs of `selection` with an id above `after` (`batch`: the
    keywords of `_selected_batch`)."""
    return _selected_batch(conn, queries.RUNS_PRUNE_SELECTED, selection, **batch)


def job_type_pauses_list(conn: Any) -> list[TypePause]:
    cursor = conn.cursor(row_factory=class_row(TypePause))
    return cursor.execute(queries.JOB_TYPE_PAUSES_LIST).fetchall()


def job_types_pause(
    conn: Any,
    job_types: Sequence[str],
    *,
    reason: str | None,
    actor: str,
    now: datetime | None = None,
) -> list[str]:
    """Pause `job_types`; returns those that were not paused already."""
    params = {"job_types": list(job_types), "reason": reason, "actor": actor, "now": now}
    return [row[0] for row in conn.execute(queries.JOB_TYPES_PAUSE, params).fetchall()]


def job_types_resume(conn: Any, job_types: Sequence[str]) -> list[str]:
    """Resume `job_types`; returns those that were paused."""
    params = {"job_types": list(job_types)}
    return [row[0] for row in conn.execute(queries.JOB_TYPES_RESUME, params).fetchall()]


def audit_insert(
    conn: Any,
    *,
    actor: str,
    command: str,
    selection: dict[str, Any],
    changed: int,
    sample_ids: Sequence[int],
    reason: str | None,
) -> int:
    """Record a state-changing command in the caller's transaction; returns its id."""
    params = {
        "actor": actor,
        "command": command,
        "selection": json.dumps(selection),
        "changed": changed,
        "sample_ids": list(sample_ids)[:AUDIT_SAMPLE],
        "reason": reason,
    }
    return int(conn.execute(queries.AUDIT_INSERT, params).fetchone()[0])


def audit_batch_insert(conn: Any, audit_id: int, ids: Sequence[int]) -> None:
    """Count a later batch's runs in the command's audit entry, in that batch's transaction."""
    params = {"id": audit_id, "changed": len(ids), "sample_ids": list(ids)[:AUDIT_SAMPLE]}
    conn.execute(queries.AUDIT_BATCH_INSERT, params)


def audit_list(
    conn: Any, *, since: float | None = None, now: datetime | None = None
) -> list[AuditEntry]:
    cursor = conn.cursor(row_factory=class_row(AuditEntry))
    params = {"since": since, "now": now, "sample": AUDIT_SAMPLE}
    return cursor.execute(queries.AUDIT_LIST, params).fetchall()


def audit_prune(conn: Any, *, older_than: float, now: datetime | None = None) -> int:
    """Delete audit rows older than `older_than` seconds; returns how many went."""
    return conn.execute(queries.AUDIT_PRUNE, {"older_than": older_than, "now": now}).rowcount
