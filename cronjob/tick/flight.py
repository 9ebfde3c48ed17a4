"""A run in flight, and what its handler returned: the values the pool and the async
executor share.

A `Flight` is made by the pool for each claimed run, and its `state` is changed by
the pool alone, under the pool's lock; `cronjob.tick.pool`'s docstring has the table
of states and of who moves a run from one to the next.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cronjob.context import JobContext
from cronjob.handlers import HandlerSpec
from cronjob.models import ClaimedRun, Outcome

if TYPE_CHECKING:
    from cronjob.runlog import RunLog


class FlightState(enum.Enum):
    QUEUED = "queued"
    STARTED = "started"
    DONE = "done"
    SETTLED = "settled"


@dataclass(slots=True)
class Slot:
    """A worker thread's place; retired when its handler overran its timeout."""

    retired: bool = False
    chunk: Sequence[Flight] = ()  # the runs it was handed last


@dataclass(slots=True)  # made once per run: slots make it cheaper to build and read
class Flight:
    run: ClaimedRun
    spec: HandlerSpec
    ctx: JobContext
    state: FlightState = FlightState.QUEUED
    started: float | None = None
    slot: Slot | None = None
    # What its handler logged (cronjob.runlog), kept by the run-log observer
    # (tick/observers.py) while the handler runs, and written with the outcome.
    logs: RunLog | None = None
    capture: Any = None  # the run log's context token while the handler runs

    @property
    def keeps_logs(self) -> bool:
        return self.spec.capture_logs

    def run_fields(self) -> dict[str, Any]:
        """The run's fields on every line its handler logs, as ctx.log binds them."""
        run = self.run
        fields: dict[str, Any] = {
            "run_id": run.id,
            "job_type": run.job_type,
            "attempt": run.attempt,
        }
        if run.tenant_id is not None:
            fields["tenant_id"] = run.tenant_id
        return fields


@dataclass(slots=True)
class Result:
    flight: Flight
    outcome: Outcome
    duration: float
    # The handler used ctx.db: its worker already recorded success in that
    # transaction; `kept` says whether the lease was still held when it did.
    finalized: bool = False
    kept: bool = False
