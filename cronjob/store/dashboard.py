"""What the dashboard reads beyond `status`: pages of runs and of the audit trail, and the
last day for its charts. The statements are queries.dashboard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import class_row, dict_row, kwargs_row

from cronjob.models import AuditEntry, Run, Selection, Status
from cronjob.queries import dashboard as queries
from cronjob.store.incidents import AUDIT_SAMPLE

# Past every id a bigserial can give: the first page's `before`.
NO_ID_ABOVE = 2**63 - 1
# The statuses the partial indexes over runnable and running runs hold.
UNFINISHED = frozenset({"queued", "failed", "running"})
# The status of the runs that hold a lease: as many as the ticks run at once.
RUNNING = frozenset({"running"})


@dataclass(frozen=True)
class RunPage:
    """A page of runs, newest first, and where the next one starts.

    `searched_down_to` is the lowest id the page could read: below it lie runs the page did
    not look at. `older` is the `before` of the next page, None when no run is left below.
    """

    runs: tuple[Run, ...]
    searched_down_to: int
    older: int | None


def _listed_run(*, status: str, **columns: Any) -> Run:
    return Run(status=Status(status), **columns)


def runs_list_page(
    conn: Any,
    selection: Selection,
    *,
    before: int | None,
    limit: int,
    window: int | None,
) -> RunPage:
    """The newest `limit` runs of `selection` below the id `before` (None: from the newest).

    With a `window`, the page reads at most that many ids below its start: the next page
    (`older`) goes on below them. Without one, the page reads down to the oldest run, which
    only a selection an index bounds should ask for: none at all (the primary key), or
    running runs only (their partial index). Waiting runs have no index in id order: a page
    of them needs the window however long the backlog (the primary key's range bounds it).
    """
    lowest, highest = conn.execute(queries.RUNS_LIST_PAGE_BOUNDS).fetchone()
    if highest is None:
        return RunPage((), 0, None)
    start = min(before or NO_ID_ABOVE, highest + 1)
    floor = max(lowest, start - window) if window is not None else lowest

    params = {
        **_filter_params(selection),
        "before": start,
        "floor": floor,
        "limit": limit,
        "statuses": _listed(selection.statuses),
    }
    unfinished = selection.statuses and set(selection.statuses) <= UNFINISHED
    sql = queries.RUNS_LIST_PAGE_UNFINISHED if unfinished else queries.RUNS_LIST_PAGE
    cursor = conn.cursor(row_factory=kwargs_row(_listed_run))
    runs = tuple(cursor.execute(sql, params).fetchall())
    if len(runs) == limit:
        older: int | None = runs[-1].id
    else:
        older = floor if floor > lowest else None
    return RunPage(runs, floor, older if older is not None and older > lowest else None)


def _listed(values: tuple[Any, ...] | None) -> list[Any] | None:
    return None if values is None else list(values)


def _filter_params(selection: Selection) -> dict[str, Any]:
    """The parameters of queries.dashboard's filters of runs (all but the statuses)."""
    return {
        "job_types": _listed(selection.job_types),
        "tenants": _listed(selection.tenants),
        "error_types": _listed(selection.error_types),
        "definition_id": selection.definition_id,
        "batch_id": selection.batch_id,
        "since": selection.since,
        "until": selection.until,
    }


def runs_count_by_status(
    conn: Any, selection: Selection, *, window: int
) -> tuple[dict[str, int], bool]:
    """The runs of `selection` (its statuses aside) by status, among the newest `window`
    ids: every status named, zero when none; and whether those were all the ids there are."""
    lowest, highest = conn.execute(queries.RUNS_LIST_PAGE_BOUNDS).fetchone()
    counted = dict.fromkeys((s.value for s in Status), 0)
    if highest is None:
        return counted, True
    floor = highest + 1 - window
    params = {**_filter_params(selection), "floor": floor}
    for status, runs in conn.execute(queries.RUNS_COUNT_BY_STATUS, params).fetchall():
        counted[status] = int(runs)
    return counted, floor <= lowest


def run_get_traceparent(conn: Any, run_id: int) -> str | None:
    row = conn.execute(queries.RUN_GET_TRACEPARENT, {"id": run_id}).fetchone()
    return row[0] if row else None


def audit_list_page(conn: Any, *, before: int | None, limit: int) -> list[AuditEntry]:
    """The newest `limit` audit entries below the id `before` (None: from the newest)."""
    cursor = conn.cursor(row_factory=class_row(AuditEntry))
    params = {"before": before or NO_ID_ABOVE, "limit": limit, "sample": AUDIT_SAMPLE}
    return cursor.execute(queries.AUDIT_LIST_PAGE, params).fetchall()


@dataclass(frozen=True)
class ChartMinute:
    """One minute of the last day: runs finished by outcome, and the longest wait of a run
    that started in it (None: none started)."""

    minute: datetime
    succeeded: int
    dead: int
    cancelled: int
    longest_wait: float | None


def runs_chart_last_day(conn: Any, *, now: datetime) -> Sequence[ChartMinute]:
    """The minutes of the day before `now` in which a run finished or started, in order."""
    cursor = conn.cursor(row_factory=dict_row)
    rows = cursor.execute(queries.RUNS_CHART_LAST_DAY, {"now": now}).fetchall()
    return [ChartMinute(**row) for row in rows]
