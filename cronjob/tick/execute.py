"""Running one handler: call it, and turn whatever happens into an Outcome.

An executor calls `execute` for each run it starts; the thread pool is one. When
the handler used `ctx.db`, its success is recorded inside that transaction by
`commit_success`, so the handler's writes and "succeeded" commit together.
"""

from __future__ import annotations

import dataclasses
import traceback
from datetime import datetime
from typing import TYPE_CHECKING

from cronjob import store, transitions
from cronjob.context import AsyncJobContext, JobContext
from cronjob.handlers import Fail, Retry
from cronjob.models import ClaimedRun, Errored, Outcome, Succeeded, UnreadablePayload
from cronjob.text import one_line, redact, storable

if TYPE_CHECKING:
    from cronjob.runlog import RunLog
    from cronjob.tick.flight import Flight
    from cronjob.tick.observers import Observers

TRACEBACK_LIMIT = 8000


def execute(flight: Flight, observers: Observers | None = None) -> Outcome:
    """Call the flight's handler and turn whatever happens into an Outcome. Never raises.

    `observers` are told just before the call and just after (tick/observers.py), on
    this thread.
    """
    spec, run, ctx = flight.spec, flight.run, flight.ctx
    if observers is not None:
        observers.started(flight)
    raised = None
    if type(run.payload) is UnreadablePayload:
        outcome: Outcome = _unreadable(run.payload)
    else:
        try:
            returned = spec.func(ctx, run.payload)
            if hasattr(returned, "__await__"):
                close = getattr(returned, "close", None)
                if close is not None:
                    close()  # no "never awaited" warning: the error below says it all
                raise TypeError(
                    f"the handler for {spec.job_type!r} returned an awaitable though it is "
                    "not an `async def` function: declare it with `async def`"
                )
            outcome = Succeeded()
        except BaseException as exc:  # even SystemExit: recorded, never raised
            outcome, raised = outcome_of(exc), exc
    if observers is not None:
        observers.returned(flight, outcome, raised)
    return outcome


async def execute_async(flight: Flight, observers: Observers | None = None) -> Outcome:
    """Await an `async def` handler on the tick's event loop, as `execute` calls a plain one.

    A task cancelled for its timeout sees CancelledError; if the handler lets it out,
    it ends here like any other exception (the timeout is recorded by the tick).
    """
    spec, run = flight.spec, flight.run
    if observers is not None:
        observers.started(flight)
    raised = None
    if type(run.payload) is UnreadablePayload:
        outcome: Outcome = _unreadable(run.payload)
    else:
        try:
            await spec.func(flight.ctx, run.payload)
            outcome = Succeeded()
        except BaseException as exc:
            outcome, raised = outcome_of(exc), exc
    if observers is not None:
        observers.returned(flight, outcome, raised)
    return outcome


def outcome_of(exc: BaseException) -> Errored:
    """What a handler's exception means: Retry and Fail say so; anything else is an error."""
    if isinstance(exc, Retry):
        return Errored("Retry", _storable(_message(exc)), None, retry_delay=exc.delay)
    if isinstance(exc, Fail):
        if exc.error is not None:
            return dataclasses.replace(errored(exc.error), permanent=True)
        message = _storable(_message(exc) or "failed permanently")
        return Errored("Fail", message, _trimmed_traceback(exc), permanent=True)
    return errored(exc)


def timed_out(timeout: float) -> Errored:
    """The outcome of a handler still running past its `timeout`, given up by the tick."""
    return Errored("timeout", f"handler still running after its {timeout:g}s timeout")


def _unreadable(payload: UnreadablePayload) -> Errored:
    # Retrying cannot help: the same text comes back on every claim.
    return Errored("UnreadablePayload", payload.reason, permanent=True)


def commit_success(
    run: ClaimedRun,
    ctx: JobContext,
    duration: float,
    *,
    worker: str,
    now: datetime | None,
    logs: RunLog | None = None,
) -> bool:
    """Record success in the handler's own transaction and commit it; False if the lease was lost.

    The success write is fenced by the lease token inside that transaction: if the
    run was cancelled, handed back or re-claimed meanwhile, it matches no row and
    everything rolls back when the context closes. It takes the run's row lock
    last, just before COMMIT, so the tick's heartbeat and hand-back wait at most
    that long for it, and never in a cycle. Raises what the database raised.
    """
    conn = ctx.handler_transaction()
    kept = store.runs_finalize_many(
        conn, [transitions.succeeded(run, duration, logs)], worker=worker, now=now
    )
    if kept:
        conn.commit()
    return bool(kept)


async def commit_success_async(
    run: ClaimedRun,
    ctx: AsyncJobContext,
    duration: float,
    *,
    worker: str,
    now: datetime | None,
    logs: RunLog | None = None,
) -> bool:
    """As `commit_success`, in an async handler's own transaction (`await ctx.db`)."""
    conn = await ctx.handler_transaction_async()
    kept = await store.runs_finalize_many_async(
        conn, [transitions.succeeded(run, duration, logs)], worker=worker, now=now
    )
    if kept:
        await conn.commit()
    return bool(kept)


def errored(exc: BaseException) -> Errored:
    """The outcome of a handler that raised `exc`, its text made storable."""
    cls = type(exc)
    name = (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
    message = _storable(_message(exc))[:2000] or name
    return Errored(_storable(name), message, _trimmed_traceback(exc))


def _message(exc: BaseException) -> str:
    # A handler's exception is arbitrary code: its __str__ may itself raise.
    try:
        return one_line(str(exc))
    except BaseException:
        return f"<{type(exc).__name__} whose message could not be read>"


def _trimmed_traceback(exc: BaseException) -> str | None:
    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException:
        return None
    # Redacted whole, then trimmed: trimmed first, a secret cut in two would keep its end
    # with nothing left for a pattern to know it by.
    text = _storable(text)
    if len(text) > TRACEBACK_LIMIT:
        text = "…(trimmed)…\n" + text[-TRACEBACK_LIMIT:]
    return text


def _storable(text: str) -> str:
    # Where a handler's error text enters the database: a connection string it
    # quotes loses its password here, once for the run, its history, its log line
    # and every command that shows it. PostgreSQL text holds neither NUL nor unpaired
    # surrogates; one odd error message must not fail the finalize of a whole batch.
    return storable(redact(text))
