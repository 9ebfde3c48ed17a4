"""Pure decisions: what a handler's outcome means for its run.

Every state change the runner writes is built by one of the named constructors
below, so the legal moves fit on one screen.
"""

from __future__ import annotations

import random

from cronjob.handlers import Backoff
from cronjob.models import ClaimedRun, Decision, Errored, Outcome, Status, Succeeded


def backoff_delay(attempt: int, backoff: Backoff, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter: uniform over [0, min(cap, base * 2**(attempt-1))]."""
    ceiling = min(backoff.cap, backoff.base * 2 ** min(max(attempt - 1, 0), 62))
    return (rng or random).uniform(0, ceiling)


def succeeded(run: ClaimedRun, duration: float = 0.0) -> Decision:
    return Decision(run, Status.SUCCEEDED, duration=duration)


def retryable(run: ClaimedRun, error: Errored, delay: float, duration: float = 0.0) -> Decision:
    return Decision(run, Status.FAILED, retry_delay=delay, error=error, duration=duration)


def discarded(run: ClaimedRun, error: Errored, duration: float = 0.0) -> Decision:
    return Decision(run, Status.DEAD, error=error, duration=duration)


def decide(run: ClaimedRun, outcome: Outcome, backoff: Backoff, duration: float = 0.0) -> Decision:
    match outcome:
        case Succeeded():
            return succeeded(run, duration)
        case Errored(permanent=True):
            return discarded(run, outcome, duration)
        case Errored() if run.attempt >= run.max_attempts:
            return discarded(run, outcome, duration)
        case Errored(retry_delay=float() as delay):
            return retryable(run, outcome, delay, duration)
        case Errored():
            return retryable(run, outcome, backoff_delay(run.attempt, backoff), duration)
    raise TypeError(f"unknown outcome {outcome!r}")
