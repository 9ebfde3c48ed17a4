"""What a handler sees: `ctx`."""

from __future__ import annotations

import contextlib
import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from cronjob.models import ClaimedRun

if TYPE_CHECKING:
    from cronjob.db import Database

MAX_EFFECT_KEY_BYTES = 1000  # well inside a btree entry, whatever the encoding


class LeaseLost(Exception):
    """The run was cancelled, handed back or claimed by another tick while its handler ran.

    Nothing the handler writes through `ctx.db` can commit any more, and no new
    effect may start: the run belongs to someone else now.
    """


class HandlerTransactionError(Exception):
    """`ctx.db`'s transaction can no longer commit together with the run's success."""


_EVENT_LOCK = threading.Lock()
_UNREAD = object()  # ctx.batch before its one read


class CancelEvent(threading.Event):
    """`ctx.cancelled`: a threading.Event that an `async def` handler can also await.

    `ctx.cancelled.is_set()` polls it; `await ctx.cancelled` returns once it is set,
    which the tick does from its own thread when the run is cancelled or its lease lost.
    """

    def __init__(self) -> None:
        super().__init__()
        self._waiters: list[tuple[Any, Any]] = []  # (event loop, future) of each awaiting task

    def set(self) -> None:
        with _EVENT_LOCK:
            super().set()
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)

    def __await__(self) -> Any:
        import asyncio

        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with _EVENT_LOCK:
            if self.is_set():
                future.set_result(True)
            else:
                self._waiters.append((loop, future))
        return future.__await__()


def _resolve(future: Any) -> None:
    if not future.done():
        future.set_result(True)


class _NoSpan:
    """`ctx.span` when the tick does not trace: every method a span has does nothing."""

    def is_recording(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return _nothing

    def __bool__(self) -> bool:
        return False


def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


NO_SPAN = _NoSpan()


class JobContext:
    """Everything a handler may need about the run it is executing.

    `db` is opened lazily: a handler that never touches it holds no transaction
    while it runs. When it does, the run's success is recorded in that same
    transaction, so the handler's writes and "succeeded" commit together.

    For integrations (a framework's runner): `database` opens further connections
    to the runner's database, and `lease_token` fences a write of their own to the
    run's row, as every write of the tick's is.
    """

    def __init__(self, run: ClaimedRun, database: Database) -> None:
        self.run_id: int = run.id
        self.job_type: str = run.job_type
        self.attempt: int = run.attempt
        self.tenant_id: str | None = run.tenant_id
        self.scheduled_for: datetime | None = run.scheduled_for
        self._cancelled: CancelEvent | None = None
        self._run = run
        self._database = database
        self._db: Any = None
        self._side: Any = None
        self._log: Any = None
        self._batch: Any = _UNREAD
        # The attempt's OpenTelemetry span when the tick traces (set by cronjob.tracing);
        # otherwise a stand-in whose methods do nothing, so handlers may use it always.
        self.span: Any = NO_SPAN

    @property
    def run(self) -> ClaimedRun:
        """The run as this attempt claimed it (for integrations: its result id, its trace)."""
        return self._run

    @property
    def database(self) -> Database:
        """The runner's database: `connect(autocommit=...)` and `await connect_async(...)`
        open connections of the caller's own, outside the run's transaction."""
        return self._database

    @property
    def lease_token(self) -> UUID:
        """The token of the run's lease. A write to the run's row that requires the run
        still `running` under it (the tick's lease fence) changes nothing once the run is no
        longer this handler's."""
        return self._run.lease_token

    @property
    def cancelled(self) -> CancelEvent:
        """Set when the run is cancelled or its lease is lost; check it in long loops."""
        # Made on first use: an Event costs more than a no-op handler, and most
        # handlers never look at it.
        if self._cancelled is None:
            with _EVENT_LOCK:
                if self._cancelled is None:
                    self._cancelled = CancelEvent()
        return self._cancelled

    @property
    def log(self) -> Any:
        if self._log is None:
            from cronjob.log import get_logger

            self._log = get_logger(
                run_id=self.run_id,
                job_type=self.job_type,
                attempt=self.attempt,
                **({"tenant_id": self.tenant_id} if self.tenant_id is not None else {}),
            )
        return self._log

    @property
    def db(self) -> Any:
        """A psycopg connection inside a transaction that commits with the run's success.

        Don't commit or roll it back yourself (use `ctx.db.transaction()` for a
        savepoint): the runner commits it when the handler returns, fenced by the
        lease, and fails the attempt if the handler ended it.
        """
        if self._db is None:
            from cronjob import store

            conn = self._database.connect(autocommit=False)
            try:
                store.handler_transaction_mark(conn, self._token)
            except BaseException:
                conn.close()
                raise
            self._db = conn
        return self._db

    @property
    def batch(self) -> Any:
        """The batch this run is the callback of (`cronjob.models.BatchState`: its id, its
        members' counts by status and those that did not succeed, when it started and ended,
        the schedule occurrence it fanned out for), or None. Read once, on first use, on a
        connection of its own: no other run pays for it."""
        if self._batch is _UNREAD:
            from cronjob import store

            with self._database.connect(autocommit=True) as conn:
                self._batch = store.batch_get_by_callback(conn, self.run_id)
        return self._batch

    @property
    def used_db(self) -> bool:
        return self._db is not None

    def join_transaction(self, conn: Any) -> None:
        """Make `conn`'s open transaction this run's `ctx.db`: success is recorded in it.

        For a transaction the handler's framework opened (Django's, in cronjob.django),
        before the handler runs. `conn` is psycopg-like, and its `commit()` and
        `close()` end that transaction, committing or rolling it back.
        """
        from cronjob import store

        if self._db is not None:
            raise HandlerTransactionError("ctx.db was opened before the handler's transaction")
        store.handler_transaction_mark(conn, self._token)
        self._db = conn

    def once(self, key: str) -> bool:
        """True the first time `key` is seen; recorded in `ctx.db`, atomically with success.

        For effects in the database: do them through `ctx.db` when this returns
        True, and they happen exactly once however often the run is retried.
        """
        from cronjob import store

        _check_key(key, "once")
        self._require_lease()
        return store.effect_insert_once(self.db, key, self._run)

    def at_most_once(self, key: str) -> bool:
        """True the first time `key` is seen; committed at once, on its own, before you act.

        For effects outside the database (email, HTTP) that must never happen
        twice: the key is committed before this returns, so if the process dies
        or the call fails after it, no retry will try again. The effect happens
        at most once, possibly never. Raises LeaseLost if the run is no longer
        this handler's.
        """
        from cronjob import store

        _check_key(key, "at_most_once")
        self._require_lease()
        if self._side is None:
            self._side = self._database.connect(autocommit=True)
        held, recorded = store.effect_insert_at_most_once(self._side, key, self._run)
        if not held:
            self.cancelled.set()
            raise LeaseLost(f"run {self.run_id} no longer holds its lease; {key!r} not recorded")
        return recorded

    # -- used by the runner ------------------------------------------------

    def handler_transaction(self) -> Any:
        """`ctx.db`, checked and ready for the runner to record success in it."""
        from psycopg.pq import TransactionStatus

        from cronjob import store

        conn = self._db
        _require_open_transaction(conn, TransactionStatus.INERROR)
        if store.handler_transaction_get_mark(conn) != self._token:
            raise HandlerTransactionError(
                "the handler committed or rolled back ctx.db itself, so its writes could not"
                " commit together with the run's success (use `ctx.db.transaction()` for"
                " savepoints and let the runner commit)"
            )
        store.handler_transaction_restore_limits(conn)
        return conn

    def close(self) -> None:
        """Close both connections; an uncommitted `ctx.db` transaction rolls back."""
        if self._db is None and self._side is None:
            return  # most handlers opened neither: once per run, keep it cheap
        for name in ("_db", "_side"):
            conn = getattr(self, name)
            setattr(self, name, None)
            if conn is not None:
                # A broken connection may fail to close: the server rolls back either way.
                with contextlib.suppress(Exception):
                    conn.close()

    @property
    def _token(self) -> str:
        return str(self._run.lease_token)

    def _require_lease(self) -> None:
        if self.cancelled.is_set():
            raise LeaseLost(f"run {self.run_id} was cancelled or lost its lease")


def _require_open_transaction(conn: Any, aborted: Any) -> None:
    if conn.closed:
        raise HandlerTransactionError(
            "the handler closed ctx.db (`with ctx.db:` commits and closes it), so its"
            " writes could not commit together with the run's success"
        )
    if conn.info.transaction_status == aborted:
        raise HandlerTransactionError(
            "ctx.db's transaction is aborted: a statement failed in it and the handler"
            " carried on (wrap statements that may fail in `with ctx.db.transaction():`)"
        )


def _check_key(key: Any, what: str) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"{what}() needs a non-empty string key")
    if "\x00" in key:
        raise ValueError(f"{what}() key must not contain NUL characters")
    if len(key.encode()) > MAX_EFFECT_KEY_BYTES:
        raise ValueError(f"{what}() key is longer than {MAX_EFFECT_KEY_BYTES} bytes")


class AsyncJobContext(JobContext):
    """What an `async def` handler sees: `ctx` with its database calls awaited.

    `await ctx.db` is a psycopg AsyncConnection inside a transaction that commits
    together with the run's success, fenced by the lease, exactly as `ctx.db` is for a
    plain handler; `await ctx.once(key)` and `await ctx.at_most_once(key)` likewise.
    """

    @property
    def db(self) -> Any:  # an awaitable of the AsyncConnection
        return self._handler_db()

    async def _handler_db(self) -> Any:
        if self._db is None:
            from cronjob import store

            conn = await self._database.connect_async(autocommit=False)
            try:
                await store.handler_transaction_mark_async(conn, self._token)
            except BaseException:
                await conn.close()
                raise
            self._db = conn
        return self._db

    async def once(self, key: str) -> bool:  # type: ignore[override]
        """As JobContext.once, on the AsyncConnection of `await ctx.db`."""
        from cronjob import store

        _check_key(key, "once")
        self._require_lease()
        return await store.effect_insert_once_async(await self.db, key, self._run)

    async def at_most_once(self, key: str) -> bool:  # type: ignore[override]
        """As JobContext.at_most_once: the key is committed before this returns."""
        from cronjob import store

        _check_key(key, "at_most_once")
        self._require_lease()
        if self._side is None:
            self._side = await self._database.connect_async(autocommit=True)
        held, recorded = await store.effect_insert_at_most_once_async(self._side, key, self._run)
        if not held:
            self.cancelled.set()
            raise LeaseLost(f"run {self.run_id} no longer holds its lease; {key!r} not recorded")
        return recorded

    async def handler_transaction_async(self) -> Any:
        """`await ctx.db`, checked and ready for the runner to record success in it."""
        from psycopg.pq import TransactionStatus

        from cronjob import store

        conn = self._db
        _require_open_transaction(conn, TransactionStatus.INERROR)
        if await store.handler_transaction_get_mark_async(conn) != self._token:
            raise HandlerTransactionError(
                "the handler committed or rolled back ctx.db itself, so its writes could not"
                " commit together with the run's success (use `db.transaction()` for"
                " savepoints and let the runner commit)"
            )
        await store.handler_transaction_restore_limits_async(conn)
        return conn

    async def aclose(self) -> None:
        """Close both connections; an uncommitted transaction rolls back."""
        for name in ("_db", "_side"):
            conn = getattr(self, name)
            setattr(self, name, None)
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
