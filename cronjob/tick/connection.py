"""The connection keeper: the only code that touches the tick's own connection.

One statement at a time. A statement either runs now, on the calling thread
(`run`), or is started on a short-lived thread of its own (`begin`) so that the
main thread can record and log the previous batch meanwhile; until its result is
taken (`result`), nothing else may use the connection.

A statement the database fails raises `StatementFailed`, which says what kind of
failure it was (`Failure`); the caller decides what that means (the tick stops
claiming, and after a refusal stops at once). The kind is decided here, once, for
every error the driver raises:

| kind          | what failed                                  | the keeper             |
|---------------|----------------------------------------------|------------------------|
| `INTERRUPTED` | the database could not finish it for reasons | re-opens a lost        |
|               | of its own: the connection dropped, a        | connection; when that  |
|               | restart, a timeout, a deadlock, a            | fails too,             |
|               | serialization failure                        | `ReconnectFailed`      |
| `MOVED`       | the server turned read-only (a failover, a   | has replaced the       |
|               | demoted primary), and a fresh connection     | connection with the    |
|               | reached one that takes writes                | fresh one              |
| `REJECTED`    | the statement's own rows: a constraint they  | keeps the connection   |
|               | broke, a value the server cannot take; the   |                        |
|               | database takes the tick's other statements   |                        |
| `REFUSED`     | anything else: read-only with no server that | keeps the connection   |
|               | takes writes, a permission revoked, a table  |                        |
|               | or the schema gone                           |                        |

A fresh connection goes where the URL leads: with several hosts and
`target_session_attrs=read-write`, to whichever of them is the primary now.
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from cronjob.db import (
    READ_ONLY_SQL_TRANSACTION,
    ROWS_REJECTED_CLASSES,
    Database,
    database_errors,
    describe,
)
from cronjob.errors import DatabaseError, DatabaseInterrupted, JobrunnerError

if TYPE_CHECKING:
    from cronjob.tick.observers import Observers

T = TypeVar("T")

# After a lost connection: pauses before each reconnect attempt (each one itself
# retries briefly), enough for a fast restart or a failover, bounded all the same.
RECONNECT_PAUSES = (0.0, 1.0, 2.0)


class Failure(enum.Enum):
    """What kind of failure a failed statement was (the module's table)."""

    INTERRUPTED = "interrupted"
    MOVED = "moved"
    REJECTED = "rejected"
    REFUSED = "refused"


class StatementFailed(JobrunnerError):
    """The database failed one of the tick's statements; the connection is usable again.

    `error` is the database's error, when it gave one; `failure` its kind.
    """

    def __init__(
        self,
        what: str,
        error: DatabaseError | None = None,
        failure: Failure = Failure.INTERRUPTED,
    ) -> None:
        super().__init__(f"the database failed the tick's {what}")
        self.what = what
        self.error = error
        self.failure = failure

    @property
    def retryable(self) -> bool:
        """Trying again, on the connection the keeper holds now, may succeed."""
        return self.failure in (Failure.INTERRUPTED, Failure.MOVED)

    @property
    def refuses_the_tick(self) -> bool:
        """The database takes none of the tick's writes: nothing a running handler returns
        could be recorded. A statement rejected for its own rows says nothing of the others."""
        return self.failure is Failure.REFUSED


class ReconnectFailed(JobrunnerError):
    """The tick's connection was lost and could not be re-opened."""


@dataclass
class _Pending:
    """A statement under way on its own thread."""

    what: str
    finished: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class ConnectionKeeper:
    """Owns the tick's connection: runs its statements one at a time and reconnects."""

    def __init__(
        self,
        conn: Any,
        database: Database,
        log: Any,
        observers: Observers | None = None,
        notices: Callable[[Any], None] | None = None,
    ) -> None:
        self.conn = conn
        self._database = database
        self._log = log
        self._pending: _Pending | None = None
        # Each statement is handed to them as it starts (a span around it, tick/observers.py).
        self.observers = observers
        # Told every notice the database sends on the connection, on the thread whose
        # statement it came with (the claim's notes, tick/notes.py); on a fresh connection too.
        self._notices = notices
        self._listen(conn)

    def _listen(self, conn: Any) -> None:
        if self._notices is not None:
            conn.add_notice_handler(self._notices)

    def stop_listening(self) -> None:
        """No more notices to the tick: the connection may be its caller's, and outlive it."""
        if self._notices is not None:
            with contextlib.suppress(ValueError):
                self.conn.remove_notice_handler(self._notices)

    @property
    def busy(self) -> bool:
        """A statement started with `begin` has not had its result taken yet."""
        return self._pending is not None

    @property
    def finished(self) -> bool:
        """The statement under way is done: `result` will not wait."""
        return self._pending is not None and self._pending.finished.is_set()

    def run(
        self, what: str, op: Callable[[Any], T], *, passing: tuple[type[Exception], ...] = ()
    ) -> T:
        """`op(connection)` now; errors of the types in `passing` reach the caller as they are."""
        if self._pending is not None:
            raise RuntimeError(f"{what}: the result of the {self._pending.what} was not taken")
        if self.observers is not None:
            op = self.observers.statement(what, op)
        return self._guarded(what, op, passing)

    def begin(
        self,
        what: str,
        op: Callable[[Any], Any],
        *,
        then: Callable[[], None],
        inline: bool = False,
    ) -> None:
        """Start `op(connection)` on its own thread; `then()` runs on that thread when it ends.

        `inline`: run it here and now instead, for a caller with nothing to do meanwhile
        (a thread's start is a good part of a claim of one run); its result is taken as ever.
        """
        if self._pending is not None:
            raise RuntimeError(f"{what}: the {self._pending.what} is still under way")
        pending = self._pending = _Pending(what)
        conn = self.conn
        if self.observers is not None:
            op = self.observers.statement(what, op)

        def background() -> None:
            try:
                pending.result = op(conn)
            except BaseException as exc:
                pending.error = exc
            finally:
                pending.finished.set()
                then()

        if inline:
            background()
            return
        threading.Thread(target=background, name=f"jobrunner-{what}", daemon=True).start()

    def result(self) -> Any:
        """The result of the statement under way, once it is done; raised as `run` would."""
        pending, self._pending = self._pending, None
        if pending is None:
            raise RuntimeError("no statement is under way")
        pending.finished.wait()

        def replay(_conn: Any) -> Any:
            if pending.error is not None:
                raise pending.error
            return pending.result

        return self._guarded(pending.what, replay, ())

    def wait_out(self) -> None:
        """Wait for the statement under way, if any, to end; its result is dropped."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.finished.wait()

    def _guarded(
        self, what: str, op: Callable[[Any], T], passing: tuple[type[Exception], ...]
    ) -> T:
        try:
            with database_errors(passing=passing):
                return op(self.conn)
        except DatabaseError as exc:
            sqlstate = {"sqlstate": exc.sqlstate} if exc.sqlstate else {}
            self._log.warning("database error", during=what, error=exc.description, **sqlstate)
            raise StatementFailed(what, exc, self._failure(exc)) from exc

    def _failure(self, exc: DatabaseError) -> Failure:
        """Its kind (the module's table), once the keeper did what that kind asks of it."""
        if isinstance(exc, DatabaseInterrupted):
            if self.conn.broken or self.conn.closed:
                self._reconnect()
            return Failure.INTERRUPTED
        if exc.sqlstate == READ_ONLY_SQL_TRANSACTION and self._move_to_a_writable_server():
            return Failure.MOVED
        if exc.sqlstate is not None and exc.sqlstate[:2] in ROWS_REJECTED_CLASSES:
            return Failure.REJECTED
        return Failure.REFUSED

    def _move_to_a_writable_server(self) -> bool:
        """Replace the connection with a fresh one if that one takes writes; True if it did.

        Tried once, with no pause: a server that turned read-only under the tick stays so,
        and what the tick holds is better handed back soon than after a wait.
        """
        from cronjob.store.server import session_read_only

        try:
            conn = self._database.connect()
        except (JobrunnerError, OSError):  # connect translates the driver's errors
            return False
        try:
            with database_errors():
                writable = not session_read_only(conn)
        except DatabaseError:
            writable = False
        if not writable:
            _close_quietly(conn)
            return False
        _close_quietly(self.conn)
        self.conn = conn
        self._listen(conn)
        self._log.info("reconnected to a server that takes writes")
        return True

    def _reconnect(self) -> None:
        last: JobrunnerError | OSError | None = None
        for pause in RECONNECT_PAUSES:
            time.sleep(pause)
            try:
                conn = self._database.connect()
            except (JobrunnerError, OSError) as exc:  # connect translates the driver's errors
                last = exc
                continue
            try:
                self.conn.close()
            finally:
                self.conn = conn
                self._listen(conn)
            self._log.info("reconnected to the database")
            return
        raise ReconnectFailed(describe(last) if last else "unknown error")


def _close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):  # a connection given up has nothing left to release
        conn.close()
