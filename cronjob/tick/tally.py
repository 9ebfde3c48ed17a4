"""The tally: what the tick did, counted in its report and told in its log.

Every run the tick claimed is meant to end in exactly one of the report's outcome counts:
succeeded, failed (will retry), dead, lost (its outcome discarded: the lease was
lost, the run cancelled or claimed by another tick), handed back, or unrecorded
(the database failed before the outcome could be written; the run is recovered
once its lease expires). The exception: a run whose handler returned but was still
committing its own `ctx.db` transaction when a stopping tick stopped waiting for it
(see `drain.FINISHING_WAIT`); its commit decides its fate, uncounted here. A finalized
batch's "run finished" lines are written together, one `write` for the lot.

How the tick ends is told here too (`require_recorded`): a database that refused its
statements ends it with `DatabaseRefused`, runs it could not record with
`ConnectionLost`, each one line saying what became of the runs it held.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cronjob.db import READ_ONLY_SQL_TRANSACTION
from cronjob.errors import ConnectionLost, DatabaseRefused
from cronjob.log import log_many, writes
from cronjob.models import ClaimedRun, Decision, Errored, Status
from cronjob.report import SUMMARY_IDS, TickReport
from cronjob.tick.connection import Failure, StatementFailed

if TYPE_CHECKING:
    from cronjob.tick.flight import Flight
    from cronjob.tick.observers import Observers
    from cronjob.tick.pings import Pinger

Line = tuple[str, str, dict[str, Any]]  # level, event, fields


class Tally:
    """Counts outcomes into the tick's report and writes the per-run log lines."""

    def __init__(self, report: TickReport, log: Any, observers: Observers | None = None) -> None:
        self.report = report
        self.log = log
        # Told each attempt's outcome once it is written (tick/observers.py), if any watches.
        self._observers = observers if observers is not None and observers.finishing else None
        # Told each outcome once it is committed, when some schedule checks in (pings.py).
        self.pinger: Pinger | None = None
        self._blocker: int | None = None  # the run last named for blocking the event loop
        self._refusal: StatementFailed | None = None  # the first statement refused, if any
        self._last_failure: StatementFailed | None = None  # the last statement that failed

    def finalized(self, decisions: Sequence[Decision], kept: set[int]) -> None:
        """Decisions were written; the runs not in `kept` had lost their lease."""
        lines: dict[tuple[str, str], list[dict[str, Any]]] = {}
        pinger, observers = self.pinger, self._observers
        # Below info a succeeded run writes no line: it is only counted, its line never built.
        quiet, succeeded = not writes("info"), 0
        for decision in decisions:
            status = decision.status if decision.run.id in kept else None
            if quiet and status is Status.SUCCEEDED:
                succeeded += 1
            else:
                level, event, fields = self._count(
                    status, decision.run, decision.duration, decision.error
                )
                lines.setdefault((level, event), []).append(fields)
            if pinger is not None and status is not None:
                pinger.committed(decision.run, status)
            if observers is not None:
                outcome = status.value if status is not None else "lost"
                observers.finished(decision.run, outcome, decision.error)
        self.report.succeeded += succeeded
        for (level, event), records in lines.items():
            log_many(self.log, level, event, records)

    def committed_by_handler(self, run: ClaimedRun, duration: float, kept: bool) -> None:
        """The handler's `ctx.db` commit recorded the success (or matched no row: lost)."""
        self._write(self._count(Status.SUCCEEDED if kept else None, run, duration))
        if kept and self.pinger is not None:
            self.pinger.committed(run, Status.SUCCEEDED)
        if self._observers is not None:
            self._observers.finished(run, "succeeded" if kept else "lost")

    def lost(self, run: ClaimedRun, ran: float, because: str) -> None:
        self._write(self._count(None, run, ran, because=because))
        if self._observers is not None:
            self._observers.finished(run, "lost")

    def lease_lost(self, run: ClaimedRun, ran: float) -> None:
        """A lease did not renew: the run was given up, its handler told to stop."""
        self.lost(
            run,
            ran,
            because="lease lost (run cancelled, or claimed by another tick after "
            "this one stalled); the handler is told through ctx.cancelled",
        )

    def claimed_again(self, run: ClaimedRun) -> None:
        """A run this tick still held came back in one of its claims: this tick had stalled."""
        self.lost(run, 0.0, because="lease lost (the run was claimed again)")

    def timed_out(self, run: ClaimedRun, timeout: float) -> None:
        self.log.warning(
            "handler timed out: attempt recorded as failed, anything it returns later is discarded",
            run_id=run.id,
            job_type=run.job_type,
            timeout_s=timeout,
        )

    def handed_back(self, runs: Sequence[ClaimedRun], held: set[int], reason: str | None) -> None:
        for run in runs:
            if run.id not in held:
                self.lost(run, 0.0, because="lease lost before hand-back")
            elif self._observers is not None:
                self._observers.finished(run, "handed back")
        self._handed_back(
            sorted(held),
            "handed back unfinished runs: due again, attempt not counted",
            reason=reason,
        )

    def stopping(self, reason: str | None, running: int, grace: float) -> None:
        """A stop came while runs were held: nothing more is claimed."""
        self.log.info(
            "stopping: claiming nothing more", reason=reason, running=running, grace_s=grace
        )

    def waiting_for_stopping(self, count: int, grace: float) -> None:
        self.log.info("waiting for handlers told to stop", count=count, grace_s=grace)

    def event_loop_blocked(self, blocking: tuple[Flight | None, float] | None) -> None:
        """Warn of the async run holding the event loop (`Pool.blocking`), once while it does."""
        if blocking is None:
            self._blocker = None
            return
        flight, lag = blocking
        if flight is not None and flight.run.id != self._blocker:
            self._blocker = flight.run.id
            self.log.warning(
                "an async handler blocks the event loop: every other async run waits "
                "(use `await`, or a plain handler for blocking or CPU-bound work)",
                run_id=flight.run.id,
                job_type=flight.run.job_type,
                blocked_s=round(lag, 1),
            )

    def claimed(self, count: int) -> None:
        self.report.claimed += count

    def claim_recovered(self, ids: list[int]) -> None:
        """A claim's answer was lost; what it held was found by its token and handed back."""
        self.report.claimed += len(ids)
        self._handed_back(
            ids,
            "handed back the runs of a claim whose answer was lost: due again, attempt not counted",
        )

    def _handed_back(self, ids: list[int], event: str, **fields: Any) -> None:
        self.report.handed_back += len(ids)
        self.report.handed_back_ids.extend(ids)
        self.log.info(event, count=len(ids), run_ids=ids[:SUMMARY_IDS], **fields)

    def unrecorded(self, count: int) -> None:
        self.report.unrecorded += count

    def connection_lost(self, cause: str) -> ConnectionLost:
        """The error that ends a tick whose connection is gone: every claimed run is accounted."""
        r = self.report
        accounted = r.succeeded + r.failed + r.dead + r.lost + r.handed_back + r.unrecorded
        r.unrecorded += max(r.claimed - accounted, 0)
        message = "lost the database connection mid-tick and could not reconnect"
        if r.unrecorded:
            message += (
                f" ({cause}); {r.unrecorded} run(s) not finalized become claimable again "
                "when their leases expire"
            )
        else:
            message += f": {cause}"
        return ConnectionLost(message, report=r)

    def database_failed(self, failed: StatementFailed) -> None:
        """A statement failed: the first one refused decides how the tick ends. So does one
        that failed for a reason of its own, which trying it again would meet again (a
        program limit, as an index entry too large): the tick ends with an error once its
        running handlers are recorded, rather than exit 0 on every cron tick while nothing
        is claimed."""
        self._last_failure = failed
        if self._refusal is None and (
            failed.failure is not Failure.INTERRUPTED or _fails_again(failed)
        ):
            self._refusal = failed

    def require_recorded(self) -> None:
        """End the tick with an error if the database refused it or a run went unrecorded."""
        if self._refusal is not None:
            raise self._refused(self._refusal)
        if self.report.unrecorded:
            last = self._last_failure
            cause = f" ({_cause(last)})" if last is not None and last.error is not None else ""
            raise ConnectionLost(
                f"the database failed while this tick finished{cause}: "
                f"{self.report.unrecorded} run(s) not finalized become claimable again when "
                "their leases expire",
                report=self.report,
            )

    def _refused(self, failed: StatementFailed) -> DatabaseRefused:
        r, error = self.report, failed.error
        sqlstate = error.sqlstate if error is not None else None
        message = f"the database refused the tick's {_cause(failed)}"
        if failed.failure is Failure.MOVED:
            message += "; the tick reconnected to a server that takes writes"
        elif sqlstate == READ_ONLY_SQL_TRANSACTION:
            message += " (a standby, or a primary turned read-only)"
        if r.unrecorded:
            message += (
                f"; {r.unrecorded} run(s) not finalized become claimable again when their "
                "leases expire"
            )
        elif r.claimed:
            message += "; every run it claimed was recorded or handed back"
        return DatabaseRefused(message, report=r, sqlstate=sqlstate)

    def _write(self, line: Line) -> None:
        level, event, fields = line
        getattr(self.log, level)(event, **fields)

    def _count(
        self,
        status: Status | None,
        run: ClaimedRun,
        duration: float,
        error: Errored | None = None,
        because: str = "lease lost",
    ) -> Line:
        """Count one run's outcome; returns its log line."""
        report = self.report
        if status is Status.SUCCEEDED:
            report.succeeded += 1
        elif status is Status.FAILED:
            report.failed += 1
        elif status is Status.DEAD:
            report.dead += 1
        else:
            report.lost += 1
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
            return ("warning", f"run outcome discarded: {because}", fields)
        if status is Status.SUCCEEDED:
            return ("info", "run finished", fields)
        return ("warning", "run finished", fields)


# SQLSTATE classes of interruptions that are the server's, not the statement's: the
# connection (08), a rollback that broke a deadlock or a serialization conflict (40), resources
# (53), an operator, a timeout or a shutdown (57), the server's system (58).
_PASSING_CLASSES = ("08", "40", "53", "57", "58")
_LOCK_NOT_AVAILABLE = "55P03"


def _fails_again(failed: StatementFailed) -> bool:
    """An interruption the database reported for the statement's own sake: it fails again."""
    sqlstate = failed.error.sqlstate if failed.error is not None else None
    if sqlstate is None:  # the client's: the connection was lost
        return False
    return not sqlstate.startswith(_PASSING_CLASSES) and sqlstate != _LOCK_NOT_AVAILABLE


def _cause(failed: StatementFailed) -> str:
    """`claim: permission denied for table job_runs`: the statement and the server's word."""
    return f"{failed.what}: {failed.error.primary}" if failed.error is not None else failed.what
