"""Pure decisions: what a handler's outcome means for its run.

Every legal move of a run's status, and the statement that makes it: in queries.runs,
but the enqueue (queries.enqueue), materializing (queries.definitions) and an operator's
retry or cancel of a selection (queries.incidents). [fenced]: the write happens only while
the row is `running` under the caller's lease token (the lease fence,
`queries._lease_fence`), so a worker that lost its lease can never overwrite a newer outcome.

  enqueue (RUNS_INSERT_MANY), materialize (RUNS_MATERIALIZE_*)
      (new row)                     -> queued
  claim (RUNS_CLAIM_MANY)
      queued | failed, run_at due   -> running: attempt + 1, a fresh lease token
  heartbeat (RUNS_HEARTBEAT_MANY) [fenced]
      running                       -> running: lease renewed
  finalize (`decide` below, written by RUNS_FINALIZE_MANY) [fenced]
      running                       -> succeeded | failed, due after a backoff | dead
  hand back (RUNS_HAND_BACK_MANY) [fenced]
      running                       -> queued, or failed if an earlier attempt failed:
                                       due now, the attempt not counted
  rescue (RUNS_RESCUE_MANY)
      running, lease expired        -> failed, due now | dead on the final attempt
  retry, by an operator (RUNS_RETRY_MANY)
      dead | cancelled              -> queued, due now, attempts reset to 0
      queued | failed | running     -> due now, attempts kept: failed, or queued if none;
                                       a running attempt recorded as `retried`
  cancel, by an operator (RUNS_CANCEL_MANY)
      queued | failed | running     -> cancelled
  prune (RUNS_PRUNE_BATCH)
      succeeded | dead | cancelled  -> deleted, with its attempt history

A succeeded run never moves again except to be pruned. Rescue, retry and cancel
are not fenced: rescue acts because the lease is gone, and the operator's retry
and cancel take a running run from its worker, which learns it at its next
heartbeat or finalize.

Failed or dead is decided in one place: an errored attempt is dead when the
handler failed permanently or the attempt was the final one. "Final" is
`queries._FINAL_ATTEMPT`, which the claim evaluates into `ClaimedRun.final_attempt`
for `decide` below and which rescue evaluates for the runs it recovers.

Each finalize is built by the constructor named for the status it writes.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from cronjob.handlers import Backoff
from cronjob.models import ClaimedRun, Decision, Errored, Outcome, Status, Succeeded

if TYPE_CHECKING:
    from cronjob.runlog import RunLog


def backoff_delay(attempt: int, backoff: Backoff, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter: uniform over [0, min(cap, base * 2**(attempt-1))]."""
    ceiling = min(backoff.cap, backoff.base * 2 ** min(max(attempt - 1, 0), 62))
    return (rng or random).uniform(0, ceiling)


_SUCCEEDED = Status.SUCCEEDED


def succeeded(run: ClaimedRun, duration: float = 0.0, logs: RunLog | None = None) -> Decision:
    # Once per run on the tick's hot path: by position, as keywords cost a NamedTuple more.
    return Decision(run, _SUCCEEDED, None, None, duration, logs)


def failed(
    run: ClaimedRun,
    error: Errored,
    delay: float,
    duration: float = 0.0,
    logs: RunLog | None = None,
) -> Decision:
    """Failed, to be retried `delay` seconds from now."""
    return Decision(run, Status.FAILED, delay, error, duration, logs)


def dead(
    run: ClaimedRun, error: Errored, duration: float = 0.0, logs: RunLog | None = None
) -> Decision:
    """Failed for good: never retried unless an operator asks."""
    return Decision(run, Status.DEAD, None, error, duration, logs)


def decide(
    run: ClaimedRun,
    outcome: Outcome,
    backoff: Backoff,
    duration: float = 0.0,
    logs: RunLog | None = None,
) -> Decision:
    """The decision an attempt's outcome makes; `logs`, what the handler logged, goes with it."""
    match outcome:
        case Succeeded():
            return succeeded(run, duration, logs)
        case Errored(permanent=True):
            return dead(run, outcome, duration, logs)
        case Errored() if run.final_attempt:
            return dead(run, outcome, duration, logs)
        case Errored(retry_delay=float() as delay):
            return failed(run, outcome, delay, duration, logs)
        case Errored():
            return failed(run, outcome, backoff_delay(run.attempt, backoff), duration, logs)
    raise TypeError(f"unknown outcome {outcome!r}")
