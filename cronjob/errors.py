"""The error hierarchy. Each error carries the exit code the command line uses for it."""

from __future__ import annotations

from typing import Any


class JobrunnerError(Exception):
    """Base class: a command could not do its work (exit 1)."""

    exit_code = 1


class BadInput(JobrunnerError):
    """Bad usage or bad input; nothing was written (exit 2)."""

    exit_code = 2


class HandlerImportError(BadInput):
    """A handler module could not be imported."""


class MissingExtra(BadInput):
    """What was asked for needs an extra that is not installed (cronjob.extras)."""


class DatabaseError(JobrunnerError):
    """The database failed what it was asked to do.

    Raised by `cronjob.db.database_errors`, the one place driver errors are translated:
    `description` is the driver's message on one line without passwords, `sqlstate` the
    PostgreSQL error code (None when the error came from the client side), `primary` the
    server's message without its context lines, and the driver's error is the `__cause__`.
    """

    def __init__(
        self,
        message: str,
        *,
        description: str | None = None,
        sqlstate: str | None = None,
        primary: str | None = None,
    ) -> None:
        super().__init__(message)
        self.description = message if description is None else description
        self.sqlstate = sqlstate
        self.primary = self.description if primary is None else primary


class DatabaseInterrupted(DatabaseError):
    """The database could not finish a statement for reasons of its own rather than the
    statement's: the connection dropped, a timeout or a deadlock cancelled it, the server
    is shutting down or out of resources. Worth trying again later, possibly on a new
    connection."""


class DatabaseUnavailable(DatabaseError):
    """The database could not be reached."""


class ConnectionLost(DatabaseUnavailable):
    """The database went away mid-tick and what the tick held could not all be recorded.

    `report` is the tick's report up to that point, so the summary can still be shown.
    """

    def __init__(self, message: str, *, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


class DatabaseRefused(DatabaseError):
    """The database refused the tick's statements for a reason no retry on it cures: it is
    read-only (a failover, a demoted primary, a standby), a permission was revoked, a table
    or the schema is gone. The tick stopped at once, handing back what it could. Or it
    rejected one statement for its own rows (a claim whose row broke a constraint): the
    tick claimed nothing more, and recorded what its running handlers returned.

    `report` is the tick's report up to that point, so the summary can still be shown.
    """

    def __init__(self, message: str, *, report: Any = None, sqlstate: str | None = None) -> None:
        super().__init__(message, sqlstate=sqlstate)
        self.report = report


class IdempotencyConflict(JobrunnerError):
    """No longer raised: an idempotency key is unique per (job type, tenant), so a key
    another type or tenant holds belongs to another piece of work and enqueues a run of
    its own. Kept so that code catching it still imports."""


class SchemaNotReady(JobrunnerError):
    """The schema is missing or older than this version of jobrunner."""


class RunNotFound(JobrunnerError):
    """No run has the given id."""


class WaitTimedOut(JobrunnerError):
    """`wait` gave up: not every run it waited for finished in time (exit 124, as timeout(1)).

    `outcomes` are the runs as they were when it gave up (models.RunOutcome).
    """

    exit_code = 124

    def __init__(self, message: str, *, outcomes: Any = ()) -> None:
        super().__init__(message)
        self.outcomes = list(outcomes)


class DefinitionNotFound(JobrunnerError):
    """No schedule definition has the given name."""


class DefinitionExists(JobrunnerError):
    """A schedule definition with that name exists already."""


class ScheduleProblems(JobrunnerError):
    """Some due schedules could not be materialized; everything else was done."""


class TypesUnclaimable(JobrunnerError):
    """The runs of some limited job types could not be chosen by the tick's claims (what one
    of their runs holds broke the choice); every other type was claimed."""


class Interrupted(JobrunnerError):
    """SIGINT or SIGTERM stopped a command between two batches; what committed stays.

    Exits as a shell reports a process the signal ended: 128 + its number (130 for
    SIGINT, 143 for SIGTERM).
    """

    def __init__(self, message: str, *, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum
