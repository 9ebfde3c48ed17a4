"""The orchestrator: one tick is rescue → materialize → claim → run → decide → finalize.

The main thread owns the tick's connection and does all the bookkeeping: claiming,
heartbeats, finalizing, handing back. Handlers run on worker threads and talk to
the main thread through two queues, so no transaction is ever held open across
handler code (except the handler's own `ctx.db`).
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cronjob import store, transitions
from cronjob.context import JobContext
from cronjob.handlers import Fail, HandlerSpec, Retry
from cronjob.models import ClaimedRun, Decision, Errored, Outcome, Status, Succeeded, TickReport

DEFAULT_CONCURRENCY = 4
DEFAULT_BATCH_SIZE = 100
DEFAULT_MAX_RUNTIME = 50.0  # ends inside the cron minute that started it
DEFAULT_GRACE = 25.0  # below systemd's and Kubernetes' default 30 s stop timeout
TRACEBACK_LIMIT = 8000
FLUSH_INTERVAL = 0.2  # finalize at least this often while handlers are busy


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class TickOptions:
    concurrency: int = DEFAULT_CONCURRENCY
    batch_size: int = DEFAULT_BATCH_SIZE
    max_runtime: float = DEFAULT_MAX_RUNTIME
    grace: float = DEFAULT_GRACE
    lease: float | None = None  # overrides every handler's own lease
    now: datetime | None = None  # the database clock unless a test pins it
    handle_signals: bool = True


@dataclass
class _InFlight:
    run: ClaimedRun
    spec: HandlerSpec
    ctx: JobContext
    started: float | None = None
    # Set once the main thread has written this run's fate (handed back, timed
    # out, lease lost); whatever the handler returns afterwards is discarded.
    settled: bool = False
    # Set by the worker just before it records success in the handler's own
    # transaction: from then on a heartbeat that misses the run may only mean
    # that the commit went through, so the main thread waits for the result.
    finalizing: bool = False


@dataclass
class _Result:
    flight: _InFlight
    outcome: Outcome
    duration: float
    # The handler used ctx.db: its worker already recorded success in that
    # transaction; `kept` says whether the lease was still held when it did.
    finalized: bool = False
    kept: bool = False


@dataclass
class _Stop:
    reason: str | None = None
    urgent: bool = False
    at: float = 0.0
    signals: list[int] = field(default_factory=list)


class Tick:
    """One invocation of `jobrunner tick`."""

    def __init__(
        self,
        conn: Any,
        handlers: dict[str, HandlerSpec],
        *,
        connect: Callable[[], Any],
        options: TickOptions = TickOptions(),
        steps_before_claim: list[Callable[[Any, TickReport], None]] | None = None,
        log: Any = None,
    ) -> None:
        self.conn = conn
        self.handlers = handlers
        self.connect = connect
        self.options = options
        self.steps_before_claim = steps_before_claim or []
        self.worker = worker_name()
        self.report = TickReport()
        self.stop = _Stop()
        self._log = log
        self._inflight: dict[int, _InFlight] = {}
        self._decisions: list[Decision] = []
        self._work: queue.SimpleQueue[_InFlight | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[_Result] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        types = sorted(handlers)
        self._claim_args = {
            "job_types": types,
            "leases": [self._lease(handlers[t]) for t in types],
            "max_attempts": [handlers[t].max_attempts for t in types],
        }

    @property
    def log(self) -> Any:
        if self._log is None:
            from cronjob.log import get_logger

            self._log = get_logger(worker=self.worker)
        return self._log

    def _lease(self, spec: HandlerSpec) -> float:
        return self.options.lease if self.options.lease is not None else spec.lease

    # -- the story ---------------------------------------------------------

    def run(self) -> TickReport:
        started = time.monotonic()
        deadline = started + self.options.max_runtime
        restore = self._install_signal_handlers()
        try:
            self.report.rescued = len(store.runs_rescue_many(self.conn, now=self.options.now))
            for step in self.steps_before_claim:
                step(self.conn, self.report)
            if self.handlers:
                self._drain(deadline)
        finally:
            restore()
            self._stop_workers()
            self.report.elapsed = time.monotonic() - started
        return self.report

    def _drain(self, deadline: float) -> None:
        # Claimed runs queue up for the workers, so a batch is claimed while the
        # previous one still runs; heartbeats cover queued runs too.
        batch = self.options.batch_size
        capacity = self.options.concurrency + batch
        exhausted = False
        last_flush = last_beat = time.monotonic()
        beat_every = min(self._lease(s) for s in self.handlers.values()) / 3
        while True:
            now = time.monotonic()
            if self.stop.reason is None and now >= deadline:
                self.stop.reason = "max-runtime"
                self.stop.at = now
            if self.stop.reason is None and not exhausted:
                room = capacity - len(self._inflight)
                if room >= max(1, batch // 2) or not self._inflight:
                    limit = min(room, batch)
                    exhausted = len(self._claim(limit)) < limit
            if not self._inflight and (exhausted or self.stop.reason is not None):
                break
            if self.stop.reason is not None and self._grace_spent(now):
                self._hand_back_unfinished()
                break
            self._collect(wait=self._wait_time(exhausted, len(self._inflight) >= capacity))
            now = time.monotonic()
            if len(self._decisions) >= self.options.batch_size or (
                self._decisions and (exhausted or now - last_flush >= FLUSH_INTERVAL)
            ):
                self._flush()
                last_flush = now
            if now - last_beat >= beat_every and self._inflight:
                self._heartbeat()
                last_beat = now
            if exhausted and self.stop.reason is None and not self._inflight:
                # Everything we claimed is done; look once more before leaving, since
                # retries with a short delay may be due already.
                exhausted = False
        self._flush()

    def _wait_time(self, exhausted: bool, full: bool) -> float:
        if self.stop.reason is not None or exhausted or full:
            return 0.05
        return 0.0

    def _grace_spent(self, now: float) -> bool:
        return self.stop.urgent or now - self.stop.at >= self.options.grace

    # -- claim and run -----------------------------------------------------

    def _claim(self, limit: int) -> list[ClaimedRun]:
        claimed = store.runs_claim_many(
            self.conn, limit=limit, worker=self.worker, now=self.options.now, **self._claim_args
        )
        self.report.claimed += len(claimed)
        for run in claimed:
            flight = _InFlight(run, self.handlers[run.job_type], JobContext(run, self.connect))
            self._inflight[run.id] = flight
            self._ensure_workers()
            self._work.put(flight)
        return claimed

    def _ensure_workers(self) -> None:
        if len(self._threads) < min(self.options.concurrency, len(self._inflight)):
            thread = threading.Thread(
                target=self._worker_loop, name=f"jobrunner-worker-{len(self._threads)}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _stop_workers(self) -> None:
        for _ in self._threads:
            self._work.put(None)

    def _worker_loop(self) -> None:
        while True:
            flight = self._work.get()
            if flight is None:
                return
            if flight.settled:
                continue
            flight.started = time.monotonic()
            outcome = execute(flight.spec, flight.run, flight.ctx)
            duration = time.monotonic() - flight.started
            result = _Result(flight, outcome, duration)
            try:
                if flight.ctx.used_db:
                    self._finish_in_handler_transaction(result)
            finally:
                # Before the result is handed over: a failure is recorded only
                # once the handler's transaction is gone.
                flight.ctx.close()
            self._done.put(result)

    def _finish_in_handler_transaction(self, result: _Result) -> None:
        """Record success in the handler's own transaction, or leave its writes to roll back.

        The success write is fenced by the lease token inside that transaction: if
        the run was cancelled, handed back or re-claimed meanwhile, it matches no
        row and everything rolls back. It takes the run's row lock last, just
        before COMMIT, so the tick's heartbeat and hand-back wait at most that
        long for it, and never in a cycle.
        """
        flight = result.flight
        if not isinstance(result.outcome, Succeeded) or flight.settled:
            return  # closing the connection rolls the handler's writes back
        try:
            conn = flight.ctx.handler_transaction()
            flight.finalizing = True
            kept = store.runs_finalize_many(
                conn,
                [transitions.succeeded(flight.run, result.duration)],
                worker=self.worker,
                now=self.options.now,
            )
            if kept:
                conn.commit()
            result.finalized, result.kept = True, bool(kept)
        except Exception as exc:
            # Recorded as a failed attempt by the main thread, fenced like any
            # other; if the COMMIT did go through after all, that write is a no-op.
            result.outcome = _errored(exc)
            result.finalized = False

    def _collect(self, wait: float) -> None:
        try:
            result = self._done.get(timeout=wait) if wait > 0 else self._done.get_nowait()
        except queue.Empty:
            return
        while True:
            self._record(result)
            try:
                result = self._done.get_nowait()
            except queue.Empty:
                return

    def _record(self, result: _Result) -> None:
        flight = result.flight
        if flight.settled:
            return
        self._inflight.pop(flight.run.id, None)
        flight.settled = True
        if result.finalized:
            self._count(Status.SUCCEEDED if result.kept else None, flight.run, result.duration)
            return
        self._decisions.append(
            transitions.decide(flight.run, result.outcome, flight.spec.backoff, result.duration)
        )

    def _flush(self) -> None:
        if not self._decisions:
            return
        decisions, self._decisions = self._decisions, []
        kept = store.runs_finalize_many(
            self.conn, decisions, worker=self.worker, now=self.options.now
        )
        for decision in decisions:
            status = decision.status if decision.run.id in kept else None
            self._count(status, decision.run, decision.duration, decision.error)

    def _count(
        self,
        status: Status | None,
        run: ClaimedRun,
        duration: float,
        error: Errored | None = None,
    ) -> None:
        report = self.report
        if status is Status.SUCCEEDED:
            report.succeeded += 1
        elif status is Status.FAILED:
            report.failed += 1
        elif status is Status.DEAD:
            report.dead += 1
        else:
            report.lost += 1
        report.by_type[run.job_type] = report.by_type.get(run.job_type, 0) + 1
        fields: dict[str, Any] = {
            "job_type": run.job_type,
            "run_id": run.id,
            "attempt": run.attempt,
            "duration_ms": round(duration * 1000, 2),
            "outcome": status.value if status else "lost",
        }
        if run.tenant_id is not None:
            fields["tenant_id"] = run.tenant_id
        if error is not None:
            fields["error_type"] = error.error_type
            fields["error"] = error.message
        if status is None:
            self.log.warning("run outcome discarded: lease lost", **fields)
        elif status is Status.SUCCEEDED:
            self.log.info("run finished", **fields)
        else:
            self.log.warning("run finished", **fields)

    # -- leases ------------------------------------------------------------

    def _heartbeat(self) -> None:
        flights = [f for f in self._inflight.values() if not f.settled]
        if not flights:
            return
        import psycopg

        try:
            held = store.runs_heartbeat_many(
                self.conn,
                [f.run for f in flights],
                [self._lease(f.spec) for f in flights],
                now=self.options.now,
            )
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
            # Only a handler that locks job_runs rows in its own ctx.db transaction
            # can hold one long; the leases have two thirds left: try next beat.
            from cronjob.db import describe

            self.log.warning("heartbeat skipped: a run's row is locked", error=describe(exc))
            return
        for flight in flights:
            if flight.run.id not in held and not flight.finalizing:
                self._lose(flight, "lease lost: run cancelled or claimed by another tick")

    def _lose(self, flight: _InFlight, why: str) -> None:
        flight.settled = True
        flight.ctx.cancelled.set()
        self._inflight.pop(flight.run.id, None)
        self._count(None, flight.run, 0.0)
        self.log.warning(why, run_id=flight.run.id, job_type=flight.run.job_type)

    def _hand_back_unfinished(self) -> None:
        flights = list(self._inflight.values())
        for flight in flights:
            flight.settled = True
            flight.ctx.cancelled.set()
        self._inflight.clear()
        handed = store.runs_hand_back_many(
            self.conn, [f.run for f in flights], now=self.options.now
        )
        self.report.handed_back += len(handed)
        if handed:
            self.log.info("handed back unfinished runs", count=len(handed), reason=self.stop.reason)

    # -- signals -----------------------------------------------------------

    def _install_signal_handlers(self) -> Callable[[], None]:
        if (
            not self.options.handle_signals
            or threading.current_thread() is not threading.main_thread()
        ):
            return lambda: None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def on_signal(signum: int, _frame: Any) -> None:
            self.stop.signals.append(signum)
            if self.stop.reason is None:
                self.stop.reason = signal.Signals(signum).name
                self.stop.at = time.monotonic()
            else:
                self.stop.urgent = True

        for sig in previous:
            signal.signal(sig, on_signal)

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore


def execute(spec: HandlerSpec, run: ClaimedRun, ctx: JobContext) -> Outcome:
    """Call the handler and turn whatever happens into an Outcome. Never raises."""
    try:
        spec.func(ctx, run.payload)
    except Retry as exc:
        return Errored("Retry", str(exc), None, retry_delay=exc.delay)
    except Fail as exc:
        return Errored(
            "Fail", str(exc) or "failed permanently", _trimmed_traceback(exc), permanent=True
        )
    except BaseException as exc:  # even SystemExit: a handler's failure is recorded, never raised
        return _errored(exc)
    return Succeeded()


def _errored(exc: BaseException) -> Errored:
    cls = type(exc)
    name = (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
    message = " ".join(str(exc).split())[:2000] or name
    return Errored(name, message, _trimmed_traceback(exc))


def _trimmed_traceback(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if len(text) > TRACEBACK_LIMIT:
        text = "…(trimmed)…\n" + text[-TRACEBACK_LIMIT:]
    return text
