"""Where a tick's claims resume, and when a claim starts from the front again.

A claim in a tenant's turn takes that tenant's earliest due runs: a scan of
job_runs_dispatch from the front of the tenant's entries. A run the tick claimed leaves its
entry there until VACUUM removes it, and VACUUM removes nothing a transaction still open
might see. So while a snapshot is held (a long report, a forgotten `BEGIN`), every run
claimed since leaves a dead entry at the front, and each such scan visits all of them, and
their heap tuples, before the first run it may take: the claim slows down with every run
it has ever taken, for as long as the snapshot is held.

So a tick remembers, for each (priority, tenant) pair, the last run it took, and its next
claim resumes after it (jobrunner_claimable_resumed, migration 0022): its cost no longer
grows with the dead entries behind it. What such a claim cannot see, a full claim finds:
a tenant the tick has not met since its last full claim, and a run that became due behind
a floor (enqueued with a run_at already past, given an earlier one by --replace, an exclusive
run whose turn came, a run another tick's claim had locked and left). A tick makes a full
claim

- first, before it knows any floor;
- while it meets as many tenants in a claim as a claim holds runs: there may be more, and
  they take turns only in full claims, whose walk goes on from tenant to tenant;
- after a claim that resumed came back short: before the tick takes "fewer than asked" to
  mean that nothing is left;
- and when `RESCAN_EVERY` seconds have passed since its last one, or, when full claims are
  slow (as they are with a snapshot held), `SPACING` times as long as the last one took: a
  run behind a floor waits at most that long, and full claims take at most about a
  `SPACING`th of the tick's time.
"""

from __future__ import annotations

from collections.abc import Sequence

from cronjob.models import ClaimedRun, Floors

RESCAN_EVERY = 1.0  # seconds
SPACING = 20


class Resume:
    """One tick's floors, and when its next claim is a full one."""

    def __init__(self) -> None:
        self.floors: Floors = {}
        self.full_due = True
        self._last_full = 0.0  # when the last full claim came back (the tick's clock)
        self._full_took = 0.0  # and how long it took

    def floors_for(self, now: float) -> Floors | None:
        """What the next claim resumes from; None: it is a full claim."""
        spacing = max(RESCAN_EVERY, SPACING * self._full_took)
        if self.full_due or not self.floors or now - self._last_full >= spacing:
            return None
        return dict(self.floors)

    def took(
        self, runs: Sequence[ClaimedRun], *, limit: int, resumed: bool, sent: float, now: float
    ) -> None:
        """A claim for `limit` runs, sent at `sent`, came back with `runs`."""
        if not resumed:
            self.floors = {}
            self._last_full, self._full_took = now, now - sent
        for run in runs:
            # Runs of a limited type carry no run_at: they are chosen apart from their tenant's.
            if run.run_at is not None:
                self.floors[run.priority, run.tenant_id or ""] = (run.run_at, run.id)
        # A claim that resumed and came back short may have missed what only a full one sees.
        # And with a run from as many tenants as a claim holds, there may be more tenants than
        # the claim's walk took in: they take turns only in full claims.
        self.full_due = (resumed and len(runs) < limit) or len(self.floors) >= limit
