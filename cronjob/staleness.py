"""Which schedules stopped succeeding: the question behind `check --stale-schedules`.

Pure: a definition's timing and its last outcomes (one row each, kept by the database as runs
finish) in, a verdict out. A schedule is stale when an occurrence that fell due more than its
window ago has not succeeded since: not that run, and no later one either. The window is the
definition's `expect_within`, or else two of its intervals plus the default lease, so that
one late or failed run is not yet an alarm and two are. For a tenant-scoped schedule a success
of any tenant counts; one whose tenant query returns no tenants has no runs, and so no
success, and goes stale like one whose handler always fails. So does a paused schedule, which
`check` looks at only when asked to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise

from cronjob.handlers import DEFAULT_LEASE
from cronjob.models import ScheduleHealthRow

# How far back the interval of a schedule is looked for. The sparsest valid expression fires
# every eight years (29 February across 2100); walking back costs only the occurrences found.
_HORIZON = timedelta(days=366 * 9)


@dataclass(frozen=True)
class Staleness:
    """One schedule's verdict."""

    name: str
    enabled: bool
    window: float  # seconds; 0 when the schedule cannot be evaluated
    due: datetime | None  # the newest occurrence that should have succeeded by now
    stale: bool
    last_success_at: datetime | None
    last_failure_at: datetime | None
    last_failure_error: str | None
    problem: str | None = None  # why the schedule could not be evaluated

    @property
    def detail(self) -> str:
        """One line for `check`: why it is stale, or what keeps it healthy."""
        if self.problem:
            return f"{self.name} ({self.problem})"
        success = (
            f"last success {self.last_success_at:%Y-%m-%d %H:%M:%S%z}"
            if self.last_success_at
            else "never succeeded"
        )
        if not self.stale:
            return f"{self.name} ({success})"
        due = f"{self.due:%Y-%m-%d %H:%M:%S%z}" if self.due else "-"
        parts = [f"due {due} not succeeded within {_span(self.window)}", success]
        if self.last_failure_at:
            error = (self.last_failure_error or "").strip().split("\n")[0][:120]
            when = f"{self.last_failure_at:%Y-%m-%d %H:%M:%S%z}"
            parts.append(f"last failure {when}: {error}" if error else f"last failure {when}")
        return f"{self.name} ({'; '.join(parts)})"


def assess(row: ScheduleHealthRow, *, lease: float = DEFAULT_LEASE) -> Staleness:
    """The verdict on one schedule at the database time the row was read."""
    from cronjob import cron

    verdict = {
        "name": row.name,
        "enabled": row.enabled,
        "last_success_at": row.last_success_at,
        "last_failure_at": row.last_failure_at,
        "last_failure_error": row.last_failure_error,
    }
    try:
        window = (
            float(row.expect_within)
            if row.expect_within is not None
            else default_window(row.schedule, row.timezone, row.now, lease=lease)
        )
        cutoff = row.now - timedelta(seconds=window)
        # Pausing touches updated_at too, but a paused schedule has not succeeded since it
        # stopped: it counts from its creation (and its last success), not from the pause.
        start = row.updated_at if row.enabled else row.created_at
        due = cron.latest_occurrence(row.schedule, row.timezone, start, cutoff)
    except cron.CronError as exc:
        return Staleness(**verdict, window=0.0, due=None, stale=True, problem=str(exc))
    stale = due is not None and (row.last_success_for is None or row.last_success_for < due)
    return Staleness(**verdict, window=window, due=due, stale=stale)


def default_window(expression: str, timezone: str, now: datetime, *, lease: float) -> float:
    """Two intervals of the schedule around `now`, plus the lease, in seconds."""
    from cronjob import cron

    around = [
        *cron.latest_occurrences(expression, timezone, now - _HORIZON, now, 2),
        *cron.next_after(expression, timezone, now, 2),
    ]
    pairs = list(pairwise(around))
    # The gap that spans `now` is the interval an operator expects right now (a weekday
    # schedule's is a day on Tuesday and three over the weekend).
    spanning = [b - a for a, b in pairs if a <= now < b] or [b - a for a, b in pairs[-1:]]
    interval = spanning[0].total_seconds() if spanning else 86400.0
    return 2 * interval + lease


def stale_schedules(
    rows: Sequence[ScheduleHealthRow], *, include_paused: bool = False
) -> list[Staleness]:
    """The verdicts of every schedule `check` looks at: paused ones only if asked."""
    return [assess(row) for row in rows if row.enabled or include_paused]


def _span(seconds: float) -> str:
    from cronjob.health import seconds_text

    return seconds_text(seconds)
