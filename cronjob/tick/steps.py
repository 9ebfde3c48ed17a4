"""The steps of a tick that found work: rescue, materialize and the drain, run in turn by
`run_tick` on the parts they share, and the drain's parts assembled.

Imported only once the idle probe found work, so an idle tick loads none of it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from cronjob import store
from cronjob.db import Database
from cronjob.errors import JobrunnerError
from cronjob.handlers import HandlerSpec
from cronjob.report import TickReport
from cronjob.tick import observers
from cronjob.tick.batcher import Batcher
from cronjob.tick.connection import ConnectionKeeper, ReconnectFailed, StatementFailed
from cronjob.tick.drain import Drain
from cronjob.tick.leases import LeaseKeeper
from cronjob.tick.notes import ClaimNotes
from cronjob.tick.pool import Pool
from cronjob.tick.shutdown import Shutdown
from cronjob.tick.tally import Tally
from cronjob.tick.writer import Writer

if TYPE_CHECKING:
    from cronjob.tick import TickOptions
    from cronjob.tick.listen import Listener

Step = Callable[[Any, TickReport, "TickOptions"], None]
# How long observers may take to send what they hold at the end of a tick (spans to a
# collector, error reports): bounded, so a collector that is down never holds up the exit.
CLOSE_WAIT = 5.0
URGENT_CLOSE_WAIT = 0.5


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Steps:
    """Runs a tick's steps on its shutdown, connection keeper and tally; the rest of the
    parts are built to drain."""

    def __init__(
        self,
        conn: Any,
        handlers: dict[str, HandlerSpec],
        *,
        database: Database,
        options: TickOptions,
        report: TickReport,
        log: Any = None,
    ) -> None:
        from cronjob.log import get_logger

        self.handlers = handlers
        self.options = options
        self.worker = worker_name()
        self.log = log if log is not None else get_logger(worker=self.worker)
        self.shutdown = Shutdown(options.grace)
        # What watches the attempts and statements of this tick; None when nothing does.
        self.observers = observers.build(handlers, options.observers, self.log)
        self.notes = ClaimNotes(report, self.log)
        self.connection = ConnectionKeeper(
            conn, database, self.log, self.observers, notices=self.notes.noticed
        )
        self.tally = Tally(report, self.log, self.observers)
        self.database = database
        # The tick's row in job_ticks (run_tick entered it), which a listener marks as staying.
        self.tick_id: int | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Signals request a stop while the tick runs; the report says what stopped it."""
        try:
            with self.shutdown.signals_handled(self.options.owns_process):
                try:
                    yield
                finally:
                    if self.observers is not None:
                        # What they hold goes out now (spans, reports), a signal or not:
                        # briefly when a second signal asked to stop at once.
                        wait = URGENT_CLOSE_WAIT if self.shutdown.urgent else CLOSE_WAIT
                        self.observers.close(wait)
        finally:
            self.tally.report.stopped_by = self.shutdown.reason
            self.connection.stop_listening()

    def run(self, name: str, step: Step) -> None:
        """Run one step on the tick's connection, unless the tick is stopping already."""
        if self.shutdown.requested:
            return
        try:
            self.connection.run(name, lambda conn: step(conn, self.tally.report, self.options))
        except StatementFailed as failed:
            self.shutdown.request("database error", urgent=failed.refuses_the_tick)
            self.tally.database_failed(failed)
        except ReconnectFailed as exc:
            raise self.tally.connection_lost(str(exc)) from None

    def finish(self) -> None:
        """Raise what ends a tick the database refused, or that left runs unrecorded."""
        self.tally.require_recorded()

    def drain(self, deadline: float) -> None:
        """Claim, run and record due runs of the tick's job types until done or stopped."""
        if not self.handlers:
            return
        if self.options.owns_process:
            # What is loaded by now (libraries, handler modules) lives as long as the
            # process: kept out of the cyclic collector's passes, which a long drain
            # otherwise pays for every few thousand runs.
            gc.freeze()
        options = self.options
        leases = LeaseKeeper(self.handlers, lease=options.lease, now=options.now, log=self.log)
        try:
            listener = self._listener() if options.listen else None
        except StatementFailed as failed:  # as a step's: the tick says what the database did
            self.shutdown.request("database error", urgent=not failed.retryable)
            self.tally.database_failed(failed)
            return
        except ReconnectFailed as exc:
            raise self.tally.connection_lost(str(exc)) from None
        self._start_pings()
        try:
            self._drain(leases, deadline, listener)
        finally:
            if listener is not None:
                listener.close()
            if self.tally.pinger is not None:
                self.tally.pinger.close()

    def listen_until(self) -> float:
        """How long a tick that stays runs by default: to the end of the database clock's
        minute and a little into the next, when cron has started that minute's tick."""
        from cronjob.tick.listen import OVERLAP

        now = self.options.now
        try:
            return self.connection.run(
                "listen", lambda conn: store.tick_listen_until(conn, overlap=OVERLAP, now=now)
            )
        except (StatementFailed, ReconnectFailed):
            return 60.0  # the steps that follow meet the same database, and say what it did

    def _listener(self) -> Listener:
        """The tick's listener: on its own connection, or a direct one of its own
        (--listen-database-url), or polling, said in one line, where LISTEN cannot work."""
        from cronjob.tick.listen import POLL_INTERVAL, Listener

        keeper, polling, why = self.connection, None, None
        if self.options.listen_url is not None:
            database = Database(self.options.listen_url, "--listen-database-url")
            try:
                keeper = ConnectionKeeper(database.connect(), database, self.log)
            except JobrunnerError as exc:
                polling, why = POLL_INTERVAL, f"--listen-database-url: {exc}"
        elif self.connection.run("listen", store.session_is_pooled):
            polling = POLL_INTERVAL
            why = "LISTEN cannot work through a connection pooler (give --listen-database-url)"
        if why is not None:
            self.log.warning(f"polling every {POLL_INTERVAL:g}s: {why}")
        listener = Listener(
            keeper,
            job_types=sorted(self.handlers),
            shutdown=self.shutdown,
            worker=self.worker,
            log=self.log,
            poll_interval=polling,
            now=self.options.now,
            owns_connection=keeper is not self.connection,
            tick_id=self.tick_id,
        )
        try:
            listener.start()
        except BaseException:
            listener.close()
            raise
        return listener

    def _time_steps(self) -> None:
        """What a listening tick does when a schedule's time it waited for comes: materialize
        (rescue is each tick's first step, once a minute)."""
        self.run("materialize", materialize)

    def _start_pings(self) -> None:
        """Which schedules check in, asked once; with none, the tick builds no pinger."""
        try:
            targets = self.connection.run("pings", store.definitions_list_ping_targets)
        except (StatementFailed, ReconnectFailed):
            return  # the drain meets the same database next and handles it; pings never stop it
        if targets:
            from cronjob.tick.pings import Pinger

            self.tally.pinger = Pinger(targets, self.log)

    def _drain(self, leases: LeaseKeeper, deadline: float, listener: Listener | None) -> None:
        options = self.options
        # Async handlers' runs wait on the event loop, not for a thread: room for them too.
        places = options.concurrency + (
            options.async_concurrency if any(s.is_async for s in self.handlers.values()) else 0
        )
        Drain(
            connection=self.connection,
            batcher=Batcher(
                self.handlers,
                leases=leases.leases,
                concurrency=places,
                batch_size=options.batch_size,
                worker=self.worker,
                now=options.now,
                flushed_claims=listener is None,
            ),
            pool=Pool(
                self.handlers,
                concurrency=options.concurrency,
                database=self.database,
                worker=self.worker,
                now=options.now,
                async_concurrency=options.async_concurrency,
                observers=self.observers,
            ),
            leases=leases,
            shutdown=self.shutdown,
            tally=self.tally,
            writer=Writer(self.database, self.log, self.observers),
            notes=self.notes,
            listener=listener,
            time_steps=self._time_steps,
        ).run(deadline)


# -- the steps before the drain ----------------------------------------------


def rescue(conn: Any, report: TickReport, options: TickOptions) -> None:
    """Runs whose lease expired (their tick died or stalled): failed or dead, attempt counted."""
    report.rescued += len(store.runs_rescue_many(conn, now=options.now))


def materialize(conn: Any, report: TickReport, options: TickOptions) -> None:
    """Due schedule occurrences become runs; definitions that cannot are listed as problems."""
    from cronjob.materialize import BATCH_FACTOR, Materializer

    materializer = Materializer(
        tenants_sql=options.tenants_sql,
        now=options.now,
        batch_size=options.materialize_batch or options.batch_size * BATCH_FACTOR,
        only=options.definitions,
    )
    try:
        report.materialized += materializer.run(conn)
    finally:
        report.problems.extend(materializer.problems)
