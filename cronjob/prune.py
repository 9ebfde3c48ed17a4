"""Deleting finished runs: in small batches, each its own short transaction.

A single `DELETE ... WHERE finished_at < ...` over months of history would hold
row locks and a snapshot for as long as it takes, bloat the table behind it and
stall ticks; batches of a thousand keep every lock brief and let vacuum follow.
"""

from __future__ import annotations

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
    batch_size: int = DEFAULT_PRUNE_BATCH_SIZE,
    max_batches: int | None = None,
    now: datetime | None = None,
) -> PruneReport:
    """Delete finished runs (succeeded, dead, cancelled) more than `older_than` seconds old.

    Effects-ledger keys whose run is gone go too, and the batches whose runs are all gone.
    `conn` must be in autocommit mode, so each batch commits as it goes; a failure halfway
    keeps what was already pruned.
    """
    if not conn.autocommit:
        raise ValueError("prune_runs needs an autocommit connection: each batch commits alone")
    totals: dict[str, int] = {}
    batches = 0
    while max_batches is None or batches < max_batches:
        deleted = store.runs_prune_batch(
            conn, statuses=PRUNABLE, older_than=older_than, limit=batch_size, now=now
        )
        batches += 1
        for status, n in deleted.items():
            totals[status] = totals.get(status, 0) + n
        if sum(deleted.values()) < batch_size:
            break
    effects = store.effects_prune_many(conn, older_than_seconds=0.0, batch_size=batch_size, now=now)
    # A batch goes once its runs have: its row is all that is left of it.
    store.batches_prune(conn, older_than=older_than, now=now)
    return PruneReport(totals, batches, effects)
