"""Deleting finished runs: in small batches, each its own short transaction.

A single `DELETE ... WHERE finished_at < ...` over months of history would hold
row locks and a snapshot for as long as it takes, bloat the table behind it and
stall ticks; batches of a thousand keep every lock brief and let vacuum follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from cronjob import store
from cronjob.models import TERMINAL, PruneReport, Status
from cronjob.settings import DEFAULT_PRUNE_BATCH_SIZE

PRUNABLE = tuple(s.value for s in Status if s in TERMINAL)  # succeeded, dead, cancelled
TICK_MAX_BATCHES = 3  # pruning at the end of a tick must never dominate the tick


def prune_runs(
    conn: Any,
    *,
    older_than: float,
    statuses: Sequence[str] = PRUNABLE,
    batch_size: int = DEFAULT_PRUNE_BATCH_SIZE,
    max_batches: int | None = None,
    dry_run: bool = False,
    keep_effects: float = 0.0,
    now: datetime | None = None,
) -> PruneReport:
    """Delete runs in `statuses` that finished more than `older_than` seconds ago.

    Effects-ledger keys whose run is gone go too, once they are older than
    `keep_effects` seconds.

    `conn` must be in autocommit mode, so each batch commits as it goes; a
    failure halfway keeps what was already pruned. Only terminal statuses are
    ever deleted, whatever `statuses` says (the query enforces it too).
    """
    unknown = set(statuses) - set(PRUNABLE)
    if unknown:
        raise ValueError(f"not a finished status: {', '.join(sorted(unknown))}")
    if not conn.autocommit:
        raise ValueError("prune_runs needs an autocommit connection: each batch commits alone")
    if dry_run:
        counts = store.runs_count_prunable(conn, statuses=statuses, older_than=older_than, now=now)
        return PruneReport(counts, 0, True)
    totals: dict[str, int] = {}
    batches = 0
    while max_batches is None or batches < max_batches:
        deleted = store.runs_prune_batch(
            conn, statuses=statuses, older_than=older_than, limit=batch_size, now=now
        )
        batches += 1
        for status, n in deleted.items():
            totals[status] = totals.get(status, 0) + n
        if sum(deleted.values()) < batch_size:
            break
    effects = store.effects_prune_many(
        conn, older_than_seconds=keep_effects, batch_size=batch_size, now=now
    )
    return PruneReport(totals, batches, False, effects)
