"""The tick: one invocation of `jobrunner tick`, from the first question to the last line.

`run_tick` tells the whole story, in the order it happens:

    idle probe → rescue → materialize → drain → its row → prune → fold the tally → metrics

An idle tick asks one question (which enters its row in job_ticks, ended, in the same
statement) and goes straight to pruning and metrics; the rest of this package is imported
only when there is work. A tick that worked writes what it did into its row as it ends.
Folding the finished-run tally (the deltas its statements left, migration 0010) is
housekeeping for a tick that did work, so an idle one skips it.

The parts, one role each:

| module       | part               | its one job                                                 |
|--------------|--------------------|-------------------------------------------------------------|
| `__init__`   | `run_tick`         | the story above, from the idle probe to the metrics         |
| `steps`      | `Steps`            | a tick that found work: its steps in turn, its parts built  |
| `drain`      | `Drain`            | the loop: passes values between the parts until done        |
| `batcher`    | `Batcher`          | claim pacing, the decision buffer; builds their statements  |
| `pool`       | `Pool`             | each run's in-flight state; hands runs to the two below     |
| `workers`    | `Workers`          | the threads of plain handlers, handed a few runs at a time  |
| `aio`        | `AsyncExecutor`    | one event loop thread for `async def` handlers              |
| `flight`     | `Flight`           | a run in flight and its handler's result, as values         |
| `execute`    | `execute()`        | runs one handler and turns what happens into an outcome     |
| `resume`     | `Resume`           | where the next claim resumes, or that it is a full one      |
| `leases`     | `LeaseKeeper`      | heartbeats, lost leases, hand-back; the fencing rule        |
| `shutdown`   | `Shutdown`         | signals, grace, urgency                                     |
| `connection` | `ConnectionKeeper` | the tick's connection: one statement at a time, reconnect;  |
|              |                    | what kind of failure a failed statement was                 |
| `writer`     | `Writer`           | a streaming drain's second connection, for its finalizes    |
| `notes`      | `ClaimNotes`       | what a claim says of limited types besides its runs: a key  |
|              |                    | locked, a type not chosen, a rate's hold                    |
| `listen`     | `Listener`         | a tick that stays (--listen): its waits between claims      |
| `tally`      | `Tally`            | the report, and the log lines of what happened to runs      |
| `pings`      | `Pinger`           | a committed outcome's check-in ping, sent on its own thread |
| `observers`  | `Observers`        | what watches attempts and statements: run logs, spans, ...  |

Who owns what:
- Only the drain loops over the tick's work. Every other part does one thing when
  asked and returns; the worker threads, the event loop and the pinger loop only
  over what they are handed, each on a thread of its own.
- Only the connection keeper touches the tick's connection (the writer has a keeper
  of its own for its one). Parts that need SQL build the statement (a function of
  the connection, from `store`) and have the keeper run it: the batcher hands its
  statements to the loop, the lease keeper is handed the keeper by the loop. A
  failed statement raises `StatementFailed`, its kind decided by the keeper once
  (interrupted, moved to a server that takes writes, rejected for its own rows, or
  refused); the loop decides what it means (the tick stops claiming, at once after a
  refusal, and never gives up running handlers for a rejected claim), and only where a
  failure changes nothing does the part that asked swallow it (a heartbeat that
  meets a locked row, a hand-back of a claim whose answer was lost). The tally ends
  the tick with one error when the database refused it (or failed a statement in a way
  that trying again would meet again) or a run went unrecorded.
- What a claim says besides its runs comes as notices on the tick's connection: the
  keeper hands each to the claim's notes (`ClaimNotes.noticed`), on the claim's thread;
  they log what only they see, and the drain takes a rate's hold from them with the
  claim's result (`ClaimNotes.held_back`) for the batcher (`Batcher.held_back`): an
  exhausted drain waits for it rather than end.
- One database object, `cronjob.db.Database`, opens every other connection: a
  reconnect's, the writer's, and handlers' `ctx.db`.
- Only the pool changes a run's in-flight state (queued → started → done →
  settled), under its one lock; the worker threads and the event loop ask it to
  (`Pool._start`, `Pool._done_with`). Its docstring has the table.
- The drain writes no log line of its own: the tally tells what happened to runs;
  a part logs only what it alone sees (a reconnect, a skipped heartbeat, a second
  connection refused, a failed ping).
- What watches the tick (its run logs, tracing, Django's signals, error reports) is
  one set of hooks, `Observers`, built once the tick found work and held by the parts
  that call it: `execute` calls `Observers.started` and `Observers.returned` on the
  thread (or in the task) that runs the handler, around the call; the tally calls
  `Observers.finished` on the main thread once an outcome is written (or lost, or
  handed back); the connection keepers hand each statement to `Observers.statement`
  on the thread that runs it; `Steps.running` closes them at the end. The run logs'
  observer is always one of them: it gives every line a handler logs its run's fields.
- Parts never call back into each other: the loop passes values between them (a
  claim's runs from the keeper to the pool, the pool's results to the batcher as
  decisions and to the tally as counts). The one hook is `Pool.wake`, given to the
  keepers with a statement they run in the background, so a main thread waiting
  for handlers also wakes when a claim or a write is back.

The life of one run, hop by hop:
1. Claim. When `Batcher.may_claim` sees room, `Batcher.claim` builds the statement
   (`store.runs_finalize_and_claim_many`, under a fresh lease token, carrying the
   decisions so far unless the writer writes them) and `ConnectionKeeper.begin`
   runs it on a thread of its own, which wakes the main thread (`Pool.wake`) when
   it is back. `Drain._take_claim` takes its answer (`ConnectionKeeper.result`):
   the runs, as `ClaimedRun`s, and which carried decisions were written
   (`Batcher.claimed`, counted by `Tally.finalized`). A full claim opens the
   writer (`Writer.open`).
2. Hand-off. `Pool.add` makes each run a `Flight`, QUEUED, with its `JobContext`,
   the handler's `ctx`. A plain handler's run waits in `Workers.pending` until
   `Workers.dispatch` (on every `Pool.collect`) hands it to a worker thread; the
   claim's async runs go to the event loop together (`AsyncExecutor.submit`), each
   a task of its own once it has a place. Either moves it to STARTED through the
   pool (`Pool._start`).
3. Handler. `execute` (`execute_async` on the loop) calls the handler with `ctx`
   and the payload and turns what happens into an `Outcome`, telling the observers
   just before (`Observers.started`: the attempt's span and run log become current)
   and just after (`Observers.returned`). The run is then DONE
   (`Pool._done_with`); if the handler used `ctx.db` and succeeded, the thread (or
   the loop) that ran it records the success in that transaction and commits it
   (`commit_success`, fenced by the lease token, with what it logged). `ctx` is
   closed, and the `Result` goes back to the pool.
4. Decision. `Pool.collect` gives the main thread the results, their runs now
   SETTLED, and `drain.record` turns each outcome into a `Decision`
   (`transitions.decide`: succeeded, failed with a retry due later, or dead, and
   what the handler logged, `Flight.logs`)
   for the batcher's buffer (`Batcher.decided`); a success already committed in
   `ctx.db` is only counted (`Tally.committed_by_handler`). A run is settled by the
   main thread instead when it overruns its timeout (`Pool.overdue`, decided as
   `execute.timed_out`), loses its lease (`LeaseKeeper.renew`, then `Pool.settle`),
   or is handed back at a stop (`Pool.settle_all`, `LeaseKeeper.hand_back`).
5. Finalize. The decision waits in the buffer until a statement writes it: the
   next claim carries it, or `Batcher.finalize` builds `store.runs_finalize_many`
   for the keeper (`Drain._finalize`, once `Batcher.finalize_due`) or, once the
   drain streams, for the writer (`Writer.begin`). Every such write is fenced
   (`queries._lease_fence`): it changes the run's row only while the run is still
   running under its lease token, and returns the ids it changed; what handlers
   logged is written by the same statement (`queries.runs.RUNS_FINALIZE_MANY_LOGGED`).
6. Tally. `Tally.finalized` counts the outcome into the `TickReport` (a run whose
   write changed nothing is lost), writes its "run finished" line (a batch's lines
   in one write), and, when its schedule checks in, hands it to the `Pinger`
   (`Pinger.committed`), which pings from a thread of its own. The observers are told
   (`Observers.finished`): the attempt's span ends, Django's task_finished is handed
   to the thread that sends it.

What keeps it fast: the main thread owns the connection and does all the
bookkeeping; the claim's round trip runs on its own short-lived thread while the
main thread records the previous batch; once a drain streams (full claims of 100
runs or more), outcomes are written on a second connection, so the finalize of
one batch and the claim of the next run in two server backends at once; handlers
run on worker threads, handed a few runs at a time (a single worker takes them in
chunks) so that the main thread gets the interpreter back in time to start the
next claim while they run; async runs reach the event loop a claim at a time, in
one wake-up of its thread; no transaction is held open across handler code except
the handler's own (`ctx.db`); the values made once per run (`ClaimedRun`,
`Decision`) are named tuples, and below the info log level a succeeded run's log
line is never built.

Handlers never run on the main thread, even with `--concurrency 1`: a handler
running there could not be given up at its timeout (the tick would stop with
it), and while it ran no lease would be renewed, no claim taken, no stop or grace
period enforced.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cronjob.db import Database, describe
from cronjob.handlers import HandlerSpec
from cronjob.report import TickReport
from cronjob.settings import (
    DEFAULT_ASYNC_CONCURRENCY,
    DEFAULT_CLAIM_BATCH_SIZE,
    DEFAULT_CONCURRENCY,
    DEFAULT_GRACE,
    DEFAULT_MAX_RUNTIME,
)
from cronjob.store import tick_enter


@dataclass(frozen=True)
class TickOptions:
    concurrency: int = DEFAULT_CONCURRENCY  # worker threads for plain handlers
    async_concurrency: int = DEFAULT_ASYNC_CONCURRENCY  # coroutines of async def handlers
    batch_size: int = DEFAULT_CLAIM_BATCH_SIZE
    # None: to the end of the database clock's minute and a little into the next (--listen)
    max_runtime: float | None = DEFAULT_MAX_RUNTIME
    grace: float = DEFAULT_GRACE
    lease: float | None = None  # overrides every handler's own lease
    now: datetime | None = None  # the database clock unless a test pins it
    tenants_sql: str | None = None  # lists tenants for tenant-scoped schedules
    materialize_batch: int | None = None  # definitions per transaction; None: from batch_size
    definitions: tuple[int, ...] | None = None  # materialize only these; None: every one
    prune_older_than: float | None = None  # seconds; None: no pruning after the tick
    metrics_path: Path | None = None  # where to write the metrics textfile, if anywhere
    # The tick is the process's main work (the command line): SIGTERM and SIGINT
    # stop it, and what is loaded stays out of the cyclic collector while it drains.
    owns_process: bool = True
    # Makes the observers that watch this tick's attempts besides its run logs (tracing,
    # Sentry, Django's signals: cronjob.observe), given its handlers; called only once
    # the tick found work (tick/observers.py).
    observers: Callable[[dict[str, HandlerSpec]], Sequence[Any]] | None = None
    # Stay until max_runtime, claiming as soon as runs become claimable (tick/listen.py).
    listen: bool = False
    listen_url: str | None = None  # a direct session to LISTEN on, beside a pooled one


def run_tick(
    conn: Any,
    handlers: dict[str, HandlerSpec],
    *,
    database: Database,
    options: TickOptions = TickOptions(),
    log: Any = None,
) -> TickReport:
    """One tick on `conn` (the caller's, and the caller closes it); returns what it did.

    `database` opens every further connection: handlers' `ctx.db` (AsyncConnections for
    `async def` handlers), the writer's, and one to replace the tick's own if it is lost
    (closed here). Raises `ConnectionLost`, with the report so far, when the database went
    away and could not be reached again or a claimed run could not be recorded, and
    `DatabaseRefused` when it refused the tick's statements (read-only, a permission, a
    table gone).
    """
    report = TickReport()
    started = time.monotonic()
    original = conn
    # The idle probe, which enters the tick's row in job_ticks (ended already when idle); a
    # tick that stays has work to wait for whatever it finds.
    kept = _tick_rows_kept(options)
    found_work, others_due, tick_id = tick_enter(
        conn,
        handlers,
        host=socket.gethostname(),
        pid=os.getpid(),
        listen=options.listen,
        kept=kept,
        ends_within=(options.max_runtime or DEFAULT_MAX_RUNTIME) + options.grace + ENDS_BY_MARGIN,
        now=options.now,
    )
    if found_work or others_due or options.listen:
        _name_missing_handlers(conn, handlers, options, recorded=found_work or options.listen)
    found_work = found_work or options.listen
    if found_work:
        from cronjob.tick.steps import Steps, materialize, rescue

        steps = Steps(
            conn,
            handlers,
            database=database,
            options=options,
            report=report,
            log=log,
        )
        steps.tick_id = tick_id
        try:
            with steps.running():
                runtime = options.max_runtime
                if runtime is None:
                    runtime = steps.listen_until() if options.listen else DEFAULT_MAX_RUNTIME
                steps.run("rescue", rescue)
                steps.run("materialize", materialize)
                steps.drain(started + runtime)
            steps.finish()
        except BaseException:
            _close_unless(steps.connection.conn, original)
            raise
        finally:
            report.elapsed = time.monotonic() - started
        conn = steps.connection.conn
    try:
        # A tick that stays ends at its deadline: that is not a stop that leaves work undone.
        drained = report.stopped_by is None or (
            options.listen and report.stopped_by == "max-runtime"
        )
        if found_work:
            _end_row(conn, tick_id, report, kept, options.now)
        if options.prune_older_than is not None and drained:
            _prune(conn, report, options.prune_older_than)
        if found_work:
            _fold_tally(conn)
        if options.metrics_path is not None:
            _write_metrics(conn, options.metrics_path)
    finally:
        _close_unless(conn, original)
    return report


# How long the rows of ended ticks stay in job_ticks (the dashboard's recent ticks).
TICK_ROWS_KEPT = 86_400.0

# How many job types the warning about due runs without a handler names.
MISSING_HANDLERS_NAMED = 10

LOAD_HANDLERS_HINT = (
    "load their handler modules with --handlers MODULES (or JOBRUNNER_HANDLERS), the "
    "jobrunner.handlers entry points, or --handlers-path DIR for modules not installed"
)


def _name_missing_handlers(
    conn: Any, handlers: dict[str, HandlerSpec], options: TickOptions, *, recorded: bool
) -> None:
    """Once per tick: record the job types this tick handles (when it found work), and warn
    in one line about due runs of types that neither it nor any tick of late handles."""
    from cronjob.store import handlers_seen_missing_due, handlers_seen_record

    try:
        if recorded and handlers:
            from cronjob.tick.steps import worker_name

            handlers_seen_record(conn, handlers, worker_name(), now=options.now)
        missing = handlers_seen_missing_due(
            conn, handlers, most=MISSING_HANDLERS_NAMED + 1, now=options.now
        )
    except Exception as exc:
        _log_failure("looking for due runs without a handler failed", describe(exc))
        return
    if missing:
        from cronjob.log import get_logger
        from cronjob.text import one_line, printable

        named = [printable(one_line(t, limit=80)) for t in missing[:MISSING_HANDLERS_NAMED]]
        get_logger().warning(
            "due runs have no handler loaded",
            job_types=named,
            more_types=len(missing) > MISSING_HANDLERS_NAMED,
            hint=LOAD_HANDLERS_HINT,
        )


# After its --max-runtime and --grace a tick still writes, prunes and exports what it did: a
# row open this long past them is a killed tick's (the dashboard says "lost").
ENDS_BY_MARGIN = 300.0


def _tick_rows_kept(options: TickOptions) -> float:
    """How long ended ticks' rows stay: a day, or less with --prune-older-than."""
    if options.prune_older_than is None:
        return TICK_ROWS_KEPT
    return min(TICK_ROWS_KEPT, options.prune_older_than)


def _end_row(
    conn: Any, tick_id: int, report: TickReport, kept: float, now: datetime | None
) -> None:
    """What the tick did, in its row of job_ticks; a failure is logged, never the tick's."""
    from cronjob import store

    counts = {
        "materialized": report.materialized,
        "rescued": report.rescued,
        "claimed": report.claimed,
        "succeeded": report.succeeded,
        "failed": report.failed,
        "dead": report.dead,
    }
    try:
        store.ticks_end(
            conn, tick_id, stopped_by=report.stopped_by, counts=counts, kept=kept, now=now
        )
    except Exception as exc:
        _log_failure("recording the tick in job_ticks failed", describe(exc))


def _prune(conn: Any, report: TickReport, older_than: float) -> None:
    """A few batches of finished runs, after a tick that drained the queue; failures are logged.

    A tick stopped by a signal or by --max-runtime has better things to do with its time.
    """
    from cronjob.prune import TICK_MAX_BATCHES, prune_runs

    try:
        report.pruned = prune_runs(conn, older_than=older_than, max_batches=TICK_MAX_BATCHES).total
    except Exception as exc:
        _log_failure("pruning after the tick failed", describe(exc))


def _fold_tally(conn: Any) -> None:
    from cronjob import store

    try:
        store.run_tally_compact(conn)
    except Exception as exc:
        _log_failure("folding the finished-run tally failed", describe(exc))


def _write_metrics(conn: Any, path: Path) -> None:
    from cronjob import metrics

    event = "writing metrics after the tick failed"
    try:
        metrics.write_textfile(path, metrics.collect(conn))
    except OSError as exc:
        _log_failure(
            event, f"cannot write metrics to {path}: {exc.strerror or exc}", path=str(path)
        )
    except Exception as exc:
        _log_failure(event, describe(exc), path=str(path))


def _log_failure(event: str, error: str, **fields: Any) -> None:
    """Housekeeping after the work is done fails in the log, never the tick."""
    from cronjob.log import get_logger

    get_logger().error(event, error=error, **fields)


def _close_unless(conn: Any, original: Any) -> None:
    if conn is not original:
        conn.close()
