"""One call of one handler, as the test's drain would make it, with nothing left enqueued.

The run is real while the call lasts: enqueued in the test's transaction and taken as a claim
takes it, so `ctx` is whole (its lease fences `ctx.db`, `ctx.once`, `ctx.at_most_once`, a
Django task's context). The attempt is the drain's (cronjob.testing.drain): a success in
`ctx.db` is recorded in it, any other outcome decided as the tick decides it. Then the run
goes, with its attempts and logs; what the handler wrote stays as its outcome left it, and
so do its effect keys, as they outlive a run in production.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from typing import Any

from cronjob import transitions
from cronjob.handlers import is_coroutine_function
from cronjob.models import ClaimedRun, Errored
from cronjob.testing.drain import TestDrain
from cronjob.tick.flight import Result


@dataclass(frozen=True)
class Handled:
    """What one call of a handler did, and what the tick would record for it."""

    value: Any  # what the handler returned (a Django task: its return value)
    raised: BaseException | None  # what it raised: Retry, Fail, or any other exception
    status: str  # succeeded, failed (retried after `retry_delay`), dead, or lost
    error: Errored | None = None  # the error recorded: its type, message and traceback
    retry_delay: float | None = None  # seconds until the retry, when failed

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"


@dataclass
class _Call:
    value: Any = None
    raised: BaseException | None = None


def prepare(
    drain: TestDrain, job_type: str, payload: Any, *, tenant: Any, attempt: int
) -> tuple[Any, _Call]:
    """The flight of a run of `job_type` taken for one call, whose handler keeps what it
    returned or raised in the `_Call` returned with it."""
    from cronjob import store
    from cronjob.api import insert_runs, new_run

    if attempt < 1:
        raise ValueError("attempt counts from 1")
    spec = drain.handlers[job_type]
    call = _Call()
    spec = dataclasses.replace(spec, func=_capturing(spec.func, call))
    [run_id] = insert_runs(drain.conn, [new_run(job_type, payload, tenant_id=tenant)])
    token = uuid.uuid4()
    decoded, tenant_id, result_id = store.run_take(
        drain.conn, run_id, attempt=attempt, max_attempts=spec.max_attempts, lease=spec.lease,
        token=token, worker=drain.worker, now=drain.now,
    )  # fmt: skip
    run = ClaimedRun(
        run_id, job_type, decoded, tenant_id, None, attempt,
        attempt >= spec.max_attempts, token, result_id=result_id,
    )  # fmt: skip
    return drain.flight(run, spec), call


def conclude(drain: TestDrain, result: Result, call: _Call) -> Handled:
    """What the call did, told to the drain's observers (a Django task's task_finished);
    the run is gone."""
    from cronjob import store

    flight = result.flight
    try:
        if result.finalized:
            status = "succeeded" if result.kept else "lost"
            error, delay = None, None
        else:
            decision = transitions.decide(
                flight.run, result.outcome, flight.spec.backoff, result.duration, flight.logs
            )
            status, error, delay = decision.status.value, decision.error, decision.retry_delay
        value = call.value
        if status == "succeeded" and getattr(flight.spec.func, "django_task", None) is not None:
            value = _task_return_value(drain.conn, flight.run.id)
        drain.tell(flight.run, status, error)
        drain.done()
    finally:
        store.run_delete(drain.conn, flight.run.id)
    return Handled(value, call.raised, status, error, delay)


def _capturing(func: Any, call: _Call) -> Any:
    """`func`, keeping what it returns or raises in `call`; `async def` if `func` is."""
    if is_coroutine_function(func):

        async def run_async(ctx: Any, payload: Any) -> Any:
            try:
                call.value = await func(ctx, payload)
            except BaseException as exc:
                call.raised = exc
                raise
            return call.value

        wrapper: Any = run_async
    else:

        def run(ctx: Any, payload: Any) -> Any:
            try:
                call.value = func(ctx, payload)
            except BaseException as exc:
                call.raised = exc
                raise
            return call.value

        wrapper = run
    if hasattr(func, "django_task"):  # what the observers read off a Django task's handler
        wrapper.django_task = func.django_task
    return wrapper


def _task_return_value(conn: Any, run_id: int) -> Any:
    from cronjob.store import task_result_get

    row = task_result_get(conn, run_id)
    stored = row["return_value"] if row is not None else None
    return json.loads(stored) if isinstance(stored, str) else stored
