"""Observers: what watches a tick's attempts (and its statements), through one set of hooks.

Spans, run logs, Django's task signals and error reports all hang on the same points
of a run's life (the tick's map, `cronjob.tick`, tells it hop by hop):

    hook        | called by                  | on                         | when
    ------------+----------------------------+----------------------------+-------------------
    `started`   | `execute`, `execute_async` | the handler's worker       | just before the
                |                            | thread, or its task on the | handler is called
                |                            | event loop                 |
    `returned`  | the same                   | the same thread or task    | just after it
                |                            |                            | returned or raised
    `finished`  | `Tally`                    | the main thread            | the outcome is
                |                            |                            | written (or lost,
                |                            |                            | handed back)
    `statement` | `ConnectionKeeper`         | the thread that runs the   | around each of the
                |                            | statement                  | tick's statements
    `close`     | `Steps`                    | the main thread            | the tick is over

`started` and `returned` come in pairs, on one thread or task: what an observer makes
current there (a span, a run log) is current for the handler alone. `finished` comes
once per attempt that was claimed, with its outcome as the tally counts it
(`OUTCOMES`); an observer keeps what it needs of an attempt until then, by run id and
lease token (`attempt_key`), and lets go of what is left at `close` (the outcome then
`unrecorded`). A hook never raises into the tick: an observer that fails is logged,
once per hook, and the run goes on as if it were not there.

The tick builds its observers once it has found work (an idle tick builds none): the
run logs' (`RunLogs`, below), always, as they also give every line a handler logs its
run's fields; and those the caller's factory makes (`TickOptions.observers`; the command
line's is `cronjob.observe`: tracing, Sentry, Django's signals).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from cronjob import runlog

if TYPE_CHECKING:
    from uuid import UUID

    from cronjob.handlers import HandlerSpec
    from cronjob.models import ClaimedRun, Errored, Outcome
    from cronjob.tick.flight import Flight

T = TypeVar("T")

# What became of an attempt, as `finished` is told and the tally counts it.
OUTCOMES = ("succeeded", "failed", "dead", "lost", "handed back", "unrecorded")


def attempt_key(run: ClaimedRun) -> tuple[int, UUID]:
    """An attempt's key, unique within a tick: a run claimed again has a new lease token."""
    return run.id, run.lease_token


class Observer:
    """What watches attempts: every hook does nothing unless overridden."""

    def started(self, flight: Flight) -> None:
        """The handler is about to be called, on this thread (or task)."""

    def returned(self, flight: Flight, outcome: Outcome, raised: BaseException | None) -> None:
        """The handler returned or raised (`raised`), on the thread `started` was told on."""

    def finished(self, run: ClaimedRun, outcome: str, error: Errored | None) -> None:
        """The attempt's outcome (one of OUTCOMES) is written, or lost; on the main thread."""

    def statement(self, what: str, op: Callable[[Any], T]) -> Callable[[Any], T]:
        """`op`, a statement of the tick's (`what`: claim, finalize...), as it is to run."""
        return op

    def close(self, timeout: float) -> None:
        """The tick is over: let go of what is left, sending what is due within `timeout`."""


class Observers:
    """A tick's observers, called in order, each shielded from the others' failures."""

    def __init__(self, observers: Sequence[Observer], log: Any) -> None:
        self.all = tuple(observers)
        self._log = log
        self._failed: set[tuple[int, str]] = set()
        # Observers that override `finished` or `statement`: the others are not called there.
        self._finishing = tuple(o for o in self.all if _overrides(o, "finished"))
        self._wrapping = tuple(o for o in self.all if _overrides(o, "statement"))
        self.finishing = bool(self._finishing)

    def started(self, flight: Flight) -> None:
        for observer in self.all:
            try:
                observer.started(flight)
            except Exception as exc:
                self.failed(observer, "started", exc)

    def returned(self, flight: Flight, outcome: Outcome, raised: BaseException | None) -> None:
        for observer in reversed(self.all):  # as nested blocks: the last started ends first
            try:
                observer.returned(flight, outcome, raised)
            except Exception as exc:
                self.failed(observer, "returned", exc)

    def finished(self, run: ClaimedRun, outcome: str, error: Errored | None = None) -> None:
        for observer in self._finishing:
            try:
                observer.finished(run, outcome, error)
            except Exception as exc:
                self.failed(observer, "finished", exc)

    def statement(self, what: str, op: Callable[[Any], T]) -> Callable[[Any], T]:
        for observer in self._wrapping:
            try:
                op = observer.statement(what, op)
            except Exception as exc:
                self.failed(observer, "statement", exc)
        return op

    def close(self, timeout: float) -> None:
        for observer in self.all:
            try:
                observer.close(timeout)
            except Exception as exc:
                self.failed(observer, "close", exc)

    def failed(self, observer: Observer, hook: str, exc: Exception) -> None:
        """Log an observer's failure, once per observer and hook: the run goes on."""
        if (id(observer), hook) in self._failed:
            return
        self._failed.add((id(observer), hook))
        self._log.warning(
            "an attempt observer failed; the runs go on without it",
            observer=type(observer).__name__,
            hook=hook,
            error=f"{type(exc).__name__}: {str(exc)[:500]}",
        )


def _overrides(observer: Observer, hook: str) -> bool:
    return getattr(type(observer), hook) is not getattr(Observer, hook)


class RunLogs(Observer):
    """Makes each run current while its handler runs (cronjob.runlog): what it logs carries
    the run's fields, and is kept in a run log if its type keeps logs.

    The log rides on the flight (`Flight.logs`) to the decision, and is written with the
    outcome; an attempt that logged nothing writes nothing.
    """

    def __init__(self) -> None:
        from cronjob import log

        runlog.capture_logging_records(log.capture_level())

    def started(self, flight: Flight) -> None:
        flight.capture = runlog.capture(flight)  # a log is made on the first event kept

    def returned(self, flight: Flight, outcome: Outcome, raised: BaseException | None) -> None:
        token = flight.capture
        if token is not None:
            flight.capture = None
            runlog.release(token)


def build(
    handlers: dict[str, HandlerSpec],
    more: Callable[[dict[str, HandlerSpec]], Sequence[Observer]] | None,
    log: Any,
) -> Observers:
    """The observers of a tick that found work."""
    observers: list[Observer] = [RunLogs()]
    if more is not None:
        observers.extend(more(handlers))
    return Observers(observers, log)
