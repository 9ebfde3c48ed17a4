"""What `status`, `metrics` and `check` read: the snapshot of runs, the finished-run
tally, run times, and the database clock. The statements are queries.tally.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from cronjob.models import DurationSummary, RunCell, RunSnapshot, Status
from cronjob.queries import tally as queries


def runs_snapshot(conn: Any, *, now: datetime | None = None) -> RunSnapshot:
    cursor = conn.cursor(row_factory=dict_row)
    if conn.autocommit:
        with conn.pipeline(), conn.transaction():  # one round trip
            conn.execute(queries.RUNS_SNAPSHOT_PLAN)
            cursor.execute(queries.RUNS_SNAPSHOT, {"now": now})
        rows = cursor.fetchall()
    else:  # the caller's transaction: its planner settings are the caller's to choose
        rows = cursor.execute(queries.RUNS_SNAPSHOT, {"now": now}).fetchall()
    cells = tuple(_run_cell(**row) for row in rows if row["job_type"] is not None)
    return RunSnapshot(now=rows[0]["now"], cells=cells)


def _run_cell(*, now: datetime, status: str, **counts: Any) -> RunCell:
    # `now` is on every row, and belongs to the snapshot rather than to a cell.
    return RunCell(status=Status(status), **counts)


def run_tally_compact(conn: Any) -> None:
    """Fold the finished-run tally into one row per (job type, status), unless another does."""
    conn.execute(queries.RUN_TALLY_COMPACT)


def runs_summarize_durations(
    conn: Any,
    *,
    window: float,
    quantiles: Sequence[float],
    now: datetime | None = None,
) -> list[DurationSummary]:
    rows = conn.cursor(row_factory=dict_row).execute(
        queries.RUNS_SUMMARIZE_DURATIONS,
        {"window": window, "quantiles": list(quantiles), "now": now},
    )
    return [
        DurationSummary(
            job_type=row["job_type"],
            count=row["count"],
            total=row["total"],
            quantiles=tuple(zip(quantiles, row["seconds"], strict=True)),
        )
        for row in rows.fetchall()
    ]


def clock_now(conn: Any, *, now: datetime | None = None) -> datetime:
    """The database clock (or the pinned `now`): the only clock anything stored comes from."""
    return conn.execute(queries.CLOCK_NOW, {"now": now}).fetchone()[0]
