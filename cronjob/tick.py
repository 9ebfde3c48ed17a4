"""The orchestrator: one tick is rescue → materialize → claim → run → decide → finalize.

The main thread owns the tick's connection and does all the bookkeeping: claiming,
heartbeats, finalizing, handing back. A claim's round trip runs on a short-lived
thread of its own while the main thread records the previous batch; nothing else
touches the connection until it is back. Handlers run on worker threads and talk
to the main thread through two queues, so no transaction is ever held open across
handler code (except the handler's own `ctx.db`).
"""

from __future__ import annotations

import enum
import math
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
from functools import partial
from typing import Any, TypeVar

from cronjob import store, transitions
from cronjob.context import JobContext
from cronjob.errors import ConnectionLost, JobrunnerError
from cronjob.handlers import Fail, HandlerSpec, Retry
from cronjob.log import log_many
from cronjob.models import ClaimedRun, Decision, Errored, Outcome, Status, Succeeded
from cronjob.report import TickReport
from cronjob.settings import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CONCURRENCY,
    DEFAULT_GRACE,
    DEFAULT_MAX_RUNTIME,
)

TRACEBACK_LIMIT = 8000
FLUSH_INTERVAL = 0.2  # finalize at least this often while handlers are busy
# After a lost connection: pauses before each reconnect attempt (each one itself
# retries briefly), enough for a fast restart or a failover, bounded all the same.
RECONNECT_PAUSES = (0.0, 1.0, 2.0)
# How long a hand-back waits for handlers that already returned to finish their
# own bookkeeping (committing `ctx.db`), so their outcome is not thrown away.
SETTLE_WAIT = 2.0
SUMMARY_IDS = 100
# A tick claims about as many runs as its workers start in this long, never more
# than --batch-size beyond its concurrency: enough to keep them busy through a
# claim's round trip, few enough that slow runs stay claimable by other hosts.
CLAIM_HORIZON = 1.0

T = TypeVar("T")


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


class _State(enum.Enum):
    QUEUED = "queued"  # claimed, waiting for a worker
    STARTED = "started"  # a worker is running its handler
    DONE = "done"  # the handler returned; its result is on the way to the main thread
    SETTLED = "settled"  # the main thread decided its fate first: any late result is discarded


@dataclass
class _Slot:
    """A worker thread's place; retired when its handler overran its timeout."""

    retired: bool = False


@dataclass
class _InFlight:
    run: ClaimedRun
    spec: HandlerSpec
    ctx: JobContext
    state: _State = _State.QUEUED
    started: float | None = None
    slot: _Slot | None = None


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
class _Pace:
    """Runs whose handlers returned per second: the last full second, or this one so far."""

    count: int = 0
    since: float = field(default_factory=time.monotonic)
    previous: float | None = None

    def per_second(self, now: float) -> float | None:
        elapsed = now - self.since
        if elapsed >= 1.0:
            self.previous = self.count / elapsed
            self.count, self.since = 0, now
            return self.previous
        current = self.count / max(elapsed, 0.1) if self.count else None
        known = [rate for rate in (current, self.previous) if rate is not None]
        return max(known) if known else None


@dataclass
class _Claiming:
    """A finalize-and-claim round trip under way on its own thread."""

    decisions: list[Decision]
    limit: int
    finished: threading.Event = field(default_factory=threading.Event)
    result: tuple[set[int], list[ClaimedRun]] | None = None
    error: BaseException | None = None


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
        connect: Callable[..., Any],
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
        self._lock = threading.Lock()  # guards every _InFlight.state change
        self._inflight: dict[int, _InFlight] = {}
        self._decisions: list[Decision] = []
        self._work: queue.SimpleQueue[_InFlight | None] = queue.SimpleQueue()
        # None is a wake-up call: a claim under way finished.
        self._done: queue.SimpleQueue[_Result | None] = queue.SimpleQueue()
        self._claiming: _Claiming | None = None
        self._exhausted = False
        self._pace = _Pace()
        self._slots: list[_Slot] = []
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
            rescued = self._on_connection(
                "rescue", partial(store.runs_rescue_many, now=self.options.now)
            )
            self.report.rescued = len(rescued or [])
            for step in self.steps_before_claim:
                if self.stop.reason is not None:
                    break
                name = getattr(step, "__name__", type(step).__name__.lower())
                self._on_connection(name, lambda conn, step=step: step(conn, self.report))
            if self.handlers:
                self._drain(deadline)
            self._require_everything_recorded()
        finally:
            restore()
            self._stop_workers()
            self.report.stopped_by = self.stop.reason
            self.report.elapsed = time.monotonic() - started
        return self.report

    def _drain(self, deadline: float) -> None:
        # Claimed runs queue up for the workers, so a batch is claimed while the
        # previous one still runs; heartbeats cover queued runs too.
        stopping = False
        last_flush = last_beat = time.monotonic()
        beat_every = min(self._lease(s) for s in self.handlers.values()) / 3
        while True:
            now = time.monotonic()
            if self.stop.reason is None and now >= deadline:
                self._stop("max-runtime")
            if self._claiming is not None and self._claiming.finished.is_set():
                self._claimed()
            if self._may_claim():
                room = self.options.concurrency + self._backlog() - len(self._inflight)
                self._claim(min(room, self.options.batch_size))
            if self.stop.reason is not None:
                self._await_claim()
                if not stopping:
                    stopping = True
                    self._log_stopping()
                # What no worker has started yet goes back at once; what runs now
                # gets the grace period to finish.
                self._hand_back(self._settle_all({_State.QUEUED}))
                if self._grace_spent(now):
                    self._hand_back_unfinished()
                    break
            if (
                not self._inflight
                and self._claiming is None
                and (self._exhausted or self.stop.reason is not None)
            ):
                break
            # Block for a result (or the claim under way) unless there is room to
            # claim more right away.
            self._collect(wait=0.0 if self._may_claim() else 0.05)
            now = time.monotonic()
            self._enforce_timeouts(now)
            if len(self._decisions) >= self.options.batch_size or (
                self._decisions and (self._exhausted or now - last_flush >= FLUSH_INTERVAL)
            ):
                # The next claim, if one is due right away or under way, carries
                # these decisions in its own commit; otherwise they are written now.
                if self._claiming is None and not self._may_claim():
                    self._flush()
                last_flush = now
            if now - last_beat >= beat_every and self._inflight and self._heartbeat():
                last_beat = now
            if (
                self._exhausted
                and self.stop.reason is None
                and not self._inflight
                and self._claiming is None
            ):
                # Everything we claimed is done; look once more before leaving, since
                # retries with a short delay may be due already.
                self._exhausted = False
        if not self._flush():
            self._flush()  # once more, on the fresh connection if it was lost

    def _may_claim(self) -> bool:
        if self.stop.reason is not None or self._exhausted or self._claiming is not None:
            return False
        backlog = self._backlog()
        room = self.options.concurrency + backlog - len(self._inflight)
        return room >= max(1, backlog // 2) or not self._inflight

    def _backlog(self) -> int:
        """How many claimed runs may wait for a worker: what the workers start in CLAIM_HORIZON."""
        batch = self.options.batch_size
        rate = self._pace.per_second(time.monotonic())
        if rate is None:
            return min(batch, self.options.concurrency)
        return max(1, min(batch, math.ceil(rate * CLAIM_HORIZON)))

    def _grace_spent(self, now: float) -> bool:
        return self.stop.urgent or now - self.stop.at >= self.options.grace

    def _stop(self, reason: str) -> None:
        if self.stop.reason is None:
            self.stop.reason = reason
            self.stop.at = time.monotonic()

    def _log_stopping(self) -> None:
        if self._inflight:
            self.log.info(
                "stopping: claiming nothing more",
                reason=self.stop.reason,
                running=sum(f.state is _State.STARTED for f in self._inflight.values()),
                grace_s=self.options.grace,
            )

    # -- claim and run -----------------------------------------------------

    def _claim(self, limit: int) -> None:
        """Start claiming up to `limit` runs, finalizing the decisions so far in the same commit.

        The round trip runs on its own thread, so the rows of one batch are sent,
        locked and decoded while this thread records and logs the previous one.
        Every other use of the connection waits for it first (`_await_claim`).
        """
        decisions, self._decisions = self._decisions, []
        claiming = _Claiming(decisions, limit)
        op = partial(
            store.runs_finalize_and_claim_many,
            decisions=decisions,
            limit=limit,
            worker=self.worker,
            now=self.options.now,
            **self._claim_args,
        )

        def claim(conn: Any = self.conn) -> None:
            try:
                claiming.result = op(conn)
            except BaseException as exc:
                claiming.error = exc
            finally:
                claiming.finished.set()
                self._done.put(None)  # wakes the main thread if it waits for results

        self._claiming = claiming
        threading.Thread(target=claim, name="jobrunner-claim", daemon=True).start()

    def _await_claim(self) -> None:
        if self._claiming is not None:
            self._claiming.finished.wait()
            self._claimed()

    def _claimed(self) -> None:
        claiming, self._claiming = self._claiming, None
        assert claiming is not None and claiming.finished.is_set()

        def result(_conn: Any) -> tuple[set[int], list[ClaimedRun]]:
            if claiming.error is not None:
                raise claiming.error
            assert claiming.result is not None
            return claiming.result

        done = self._on_connection("claim", result)
        if done is None:
            # Kept for the next flush; finalizing is fenced by lease token, so a
            # decision that did land before the error changes nothing the second time.
            self._decisions = claiming.decisions + self._decisions
            return
        kept, claimed = done
        self._count_finalized(claiming.decisions, kept)
        self.report.claimed += len(claimed)
        self._exhausted = len(claimed) < claiming.limit
        for run in claimed:
            flight = _InFlight(run, self.handlers[run.job_type], JobContext(run, self.connect))
            self._inflight[run.id] = flight
            self._work.put(flight)
        self._ensure_workers()

    def _ensure_workers(self) -> None:
        active = sum(not s.retired for s in self._slots)
        wanted = min(self.options.concurrency, len(self._inflight))
        for _ in range(wanted - active):
            slot = _Slot()
            thread = threading.Thread(
                target=self._worker_loop,
                args=(slot,),
                name=f"jobrunner-worker-{len(self._slots)}",
                daemon=True,  # a handler stuck past its timeout must not keep the process alive
            )
            self._slots.append(slot)
            thread.start()

    def _stop_workers(self) -> None:
        for slot in self._slots:
            if not slot.retired:
                self._work.put(None)

    def _worker_loop(self, slot: _Slot) -> None:
        while True:
            flight = self._work.get()
            if flight is None:
                return
            with self._lock:
                if flight.state is not _State.QUEUED:
                    continue  # handed back or lost before a worker got to it
                flight.state = _State.STARTED
                flight.started = time.monotonic()
                flight.slot = slot
            outcome = execute(flight.spec, flight.run, flight.ctx)
            result = _Result(flight, outcome, time.monotonic() - flight.started)
            try:
                if self._mark_done(flight) and flight.ctx.used_db:
                    self._finish_in_handler_transaction(result)
            finally:
                # Before the result is handed over: a failure is recorded only
                # once the handler's transaction is gone.
                flight.ctx.close()
            self._done.put(result)
            if slot.retired:
                return  # this handler overran its timeout; a replacement took our place

    def _mark_done(self, flight: _InFlight) -> bool:
        """Claim the right to report this run's outcome; False if it was settled already."""
        with self._lock:
            if flight.state is _State.STARTED:
                flight.state = _State.DONE
                return True
            return False

    def _finish_in_handler_transaction(self, result: _Result) -> None:
        """Record success in the handler's own transaction, or leave its writes to roll back.

        The success write is fenced by the lease token inside that transaction: if
        the run was cancelled, handed back or re-claimed meanwhile, it matches no
        row and everything rolls back. It takes the run's row lock last, just
        before COMMIT, so the tick's heartbeat and hand-back wait at most that
        long for it, and never in a cycle. The run is DONE by now, so the main
        thread neither hands it back nor times it out while this commits.
        """
        flight = result.flight
        if not isinstance(result.outcome, Succeeded):
            return  # closing the connection rolls the handler's writes back
        try:
            conn = flight.ctx.handler_transaction()
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
            if result is not None:
                self._record(result)
            try:
                result = self._done.get_nowait()
            except queue.Empty:
                return

    def _record(self, result: _Result) -> None:
        flight = result.flight
        if flight.state is not _State.DONE:
            return  # settled first (handed back, timed out, lease lost): already counted
        self._inflight.pop(flight.run.id, None)
        flight.state = _State.SETTLED
        self._pace.count += 1
        if result.finalized:
            self._count(Status.SUCCEEDED if result.kept else None, flight.run, result.duration)
            return
        self._decisions.append(
            transitions.decide(flight.run, result.outcome, flight.spec.backoff, result.duration)
        )

    def _flush(self) -> bool:
        """Finalize the decisions taken so far; False if the database failed (kept for later)."""
        if not self._decisions:
            return True
        decisions, self._decisions = self._decisions, []
        kept = self._on_connection(
            "finalize",
            partial(
                store.runs_finalize_many,
                decisions=decisions,
                worker=self.worker,
                now=self.options.now,
            ),
        )
        if kept is None:
            # Kept for the next flush; the statement is fenced by lease token, so
            # writing a decision that did land before the error changes nothing.
            self._decisions = decisions + self._decisions
            return False
        self._count_finalized(decisions, kept)
        return True

    def _count_finalized(self, decisions: list[Decision], kept: set[int]) -> None:
        lines: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for decision in decisions:
            status = decision.status if decision.run.id in kept else None
            level, event, fields = self._count(
                status, decision.run, decision.duration, decision.error, log=False
            )
            lines.setdefault((level, event), []).append(fields)
        for (level, event), records in lines.items():
            log_many(self.log, level, event, records)

    def _count(
        self,
        status: Status | None,
        run: ClaimedRun,
        duration: float,
        error: Errored | None = None,
        discarded_because: str = "lease lost",
        *,
        log: bool = True,
    ) -> tuple[str, str, dict[str, Any]]:
        """Count one run's outcome and log it, or return the log line for the caller to write."""
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
            line = ("warning", f"run outcome discarded: {discarded_because}", fields)
        elif status is Status.SUCCEEDED:
            line = ("info", "run finished", fields)
        else:
            line = ("warning", "run finished", fields)
        if log:
            level, event, _ = line
            getattr(self.log, level)(event, **fields)
        return line

    # -- leases ------------------------------------------------------------

    def _heartbeat(self) -> bool:
        """Renew every lease this tick holds, running or queued; False if it must be retried."""
        flights = list(self._inflight.values())
        if not flights:
            return True
        import psycopg

        beat = partial(
            store.runs_heartbeat_many,
            runs=[f.run for f in flights],
            leases=[self._lease(f.spec) for f in flights],
            now=self.options.now,
        )
        try:
            held = self._on_connection(
                "heartbeat",
                beat,
                raising=(psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected),
            )
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
            # Only a handler that locks job_runs rows in its own ctx.db transaction
            # can hold one long; the leases have two thirds left: try next beat.
            from cronjob.db import describe

            self.log.warning("heartbeat skipped: a run's row is locked", error=describe(exc))
            return True
        if held is None:
            return False
        for flight in flights:
            if flight.run.id not in held:
                self._lose(flight)
        return True

    def _lose(self, flight: _InFlight) -> None:
        if not self._settle(flight):
            return  # its handler returned already: the fenced finalize will say so
        flight.ctx.cancelled.set()
        self._inflight.pop(flight.run.id, None)
        ran = time.monotonic() - flight.started if flight.started is not None else 0.0
        self._count(
            None,
            flight.run,
            ran,
            discarded_because="lease lost (run cancelled, or claimed by another tick after "
            "this one stalled); the handler is told through ctx.cancelled",
        )

    def _settle(self, flight: _InFlight) -> bool:
        with self._lock:
            if flight.state in (_State.QUEUED, _State.STARTED):
                flight.state = _State.SETTLED
                return True
            return False

    def _settle_all(self, states: set[_State]) -> list[_InFlight]:
        """Settle every in-flight run in `states`, in one step so no worker slips in between."""
        with self._lock:
            chosen = [f for f in self._inflight.values() if f.state in states]
            for flight in chosen:
                flight.state = _State.SETTLED
        for flight in chosen:
            flight.ctx.cancelled.set()
            self._inflight.pop(flight.run.id, None)
        return chosen

    def _enforce_timeouts(self, now: float) -> None:
        for flight in list(self._inflight.values()):
            timeout = flight.spec.timeout
            if (
                timeout is None
                or flight.started is None
                or now - flight.started < timeout
                or not self._settle(flight)
            ):
                continue
            flight.ctx.cancelled.set()
            self._inflight.pop(flight.run.id, None)
            if flight.slot is not None:
                # The thread is stuck in the handler; let another take its place
                # so the rest of the tick keeps its concurrency.
                flight.slot.retired = True
            error = Errored("timeout", f"handler still running after its {timeout:g}s timeout")
            self._decisions.append(
                transitions.decide(flight.run, error, flight.spec.backoff, now - flight.started)
            )
            self.log.warning(
                "handler timed out: attempt recorded as failed, anything it returns later "
                "is discarded",
                run_id=flight.run.id,
                job_type=flight.run.job_type,
                timeout_s=timeout,
            )
        self._ensure_workers()

    def _hand_back_unfinished(self) -> None:
        self._collect(wait=0)
        self._hand_back(self._settle_all({_State.QUEUED, _State.STARTED}))
        # Handlers that returned are finishing their bookkeeping; record them
        # rather than lose a finished outcome, but never wait long.
        until = time.monotonic() + SETTLE_WAIT
        while self._inflight and time.monotonic() < until:
            self._collect(wait=0.05)

    def _hand_back(self, flights: list[_InFlight]) -> None:
        if not flights:
            return
        hand_back = partial(
            store.runs_hand_back_many, runs=[f.run for f in flights], now=self.options.now
        )
        handed = self._on_connection("hand back", hand_back)
        if handed is None:  # once more, on the fresh connection if it was lost
            handed = self._on_connection("hand back", hand_back)
        if handed is None:
            self.report.unrecorded += len(flights)
            return
        for flight in flights:
            if flight.run.id not in handed:
                self._count(None, flight.run, 0.0, discarded_because="lease lost before hand-back")
        ids = sorted(handed)
        self.report.handed_back += len(ids)
        self.report.handed_back_ids.extend(ids)
        self.log.info(
            "handed back unfinished runs: due again, attempt not counted",
            count=len(ids),
            run_ids=ids[:SUMMARY_IDS],
            reason=self.stop.reason,
        )

    # -- the database connection ---------------------------------------------

    def _on_connection(
        self, what: str, op: Callable[[Any], T], *, raising: tuple[type[Exception], ...] = ()
    ) -> T | None:
        """Run `op` on the tick's connection; None if the database failed it.

        Any database error stops claiming (the tick winds down as on SIGTERM). A
        lost connection is re-opened, so what finishes can still be recorded; if
        that fails too the tick gives up, and what it held is recovered once the
        leases expire.
        """
        import psycopg

        if self._claiming is not None and what != "claim":
            self._await_claim()  # one statement at a time on the tick's connection
        try:
            return op(self.conn)
        except raising:
            raise
        except psycopg.OperationalError as exc:
            from cronjob.db import describe

            self.log.warning("database error", during=what, error=describe(exc))
            self._stop("database error")
            if self.conn.broken or self.conn.closed:
                self._reconnect()
            return None

    def _reconnect(self) -> None:
        import psycopg

        from cronjob.db import describe

        last: BaseException | None = None
        for pause in RECONNECT_PAUSES:
            time.sleep(pause)
            try:
                conn = self.connect()
            except (JobrunnerError, OSError, psycopg.Error) as exc:
                last = exc
                continue
            try:
                self.conn.close()
            finally:
                self.conn = conn
            self.log.info("reconnected to the database")
            return
        self._settle_all({_State.QUEUED, _State.STARTED})
        r = self.report
        accounted = r.succeeded + r.failed + r.dead + r.lost + r.handed_back + r.unrecorded
        r.unrecorded += max(r.claimed - accounted, 0)
        self.report.stopped_by = self.stop.reason
        message = "lost the database connection mid-tick and could not reconnect"
        if self.report.unrecorded:
            message += (
                f" ({describe(last) if last else 'unknown error'}); "
                f"{self.report.unrecorded} run(s) not finalized become claimable again when "
                "their leases expire"
            )
        else:
            message += f": {describe(last) if last else 'unknown error'}"
        raise ConnectionLost(message, report=self.report)

    def _require_everything_recorded(self) -> None:
        if self._decisions:
            self.report.unrecorded += len(self._decisions)
        if self.report.unrecorded:
            raise ConnectionLost(
                f"the database failed while this tick finished: {self.report.unrecorded} "
                "run(s) not finalized become claimable again when their leases expire",
                report=self.report,
            )

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
        returned = spec.func(ctx, run.payload)
        if hasattr(returned, "__await__"):
            close = getattr(returned, "close", None)
            if close is not None:
                close()  # no "never awaited" warning: the error below says it all
            raise TypeError(
                f"the handler for {spec.job_type!r} returned an awaitable: "
                "handlers must be plain functions, not async ones"
            )
    except Retry as exc:
        return Errored("Retry", _storable(_message(exc)), None, retry_delay=exc.delay)
    except Fail as exc:
        message = _storable(_message(exc) or "failed permanently")
        return Errored("Fail", message, _trimmed_traceback(exc), permanent=True)
    except BaseException as exc:  # even SystemExit: a handler's failure is recorded, never raised
        return _errored(exc)
    return Succeeded()


def _errored(exc: BaseException) -> Errored:
    cls = type(exc)
    name = (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
    message = _message(exc)[:2000] or name
    return Errored(_storable(name), _storable(message), _trimmed_traceback(exc))


def _message(exc: BaseException) -> str:
    # A handler's exception is arbitrary code: its __str__ may itself raise.
    try:
        return " ".join(str(exc).split())
    except BaseException:
        return f"<{type(exc).__name__} whose message could not be read>"


def _trimmed_traceback(exc: BaseException) -> str | None:
    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException:
        return None
    if len(text) > TRACEBACK_LIMIT:
        text = "…(trimmed)…\n" + text[-TRACEBACK_LIMIT:]
    return _storable(text)


def _storable(text: str) -> str:
    # PostgreSQL text holds neither NUL nor unpaired surrogates; one odd error
    # message must not fail the finalize of a whole batch.
    text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
