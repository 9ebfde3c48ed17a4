"""The writer: a second connection that records outcomes while the tick's own claims.

On one connection a tick's server time is spent in turn: the finalize of one
batch, then the claim of the next, in one backend that can never do both at once.
Once a drain streams (a claim came back full, with at least `STREAMING_CLAIM` runs,
so more wait behind it), its decisions are written on a connection of their own,
each write on a thread of its own as claims are, and claims carry none: the finalize
of one batch runs in one backend while the next claim runs in another. Each write is
its own transaction, fenced by the lease token as every finalize is.

Ticks that claim a few runs at a time, slow handlers' ticks among them, never open
it. It opens on a thread of its own, so the drain never waits for a connect (with its
retries, or a server slow to answer); until it is open, claims carry the decisions as
before. If the database refuses the connection, or it is lost and cannot be opened
again, the tick goes on writing through its one connection.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from cronjob.db import Database, describe
from cronjob.errors import JobrunnerError
from cronjob.models import Decision
from cronjob.tick.connection import ConnectionKeeper, ReconnectFailed, StatementFailed

if TYPE_CHECKING:
    from cronjob.tick.observers import Observers

STREAMING_CLAIM = 100  # runs in a full claim from which a tick writes on a second connection


class Writer:
    """The second connection of a streaming drain, and the decisions of the write under way."""

    def __init__(self, database: Database, log: Any, observers: Observers | None = None) -> None:
        self._database = database
        self._log = log
        self._observers = observers
        self._keeper: ConnectionKeeper | None = None
        self._opening: _Opening | None = None
        self._refused = False
        self._writing: list[Decision] = []

    @property
    def active(self) -> bool:
        """Decisions go through this writer: its connection is open (taken here once it is)."""
        if self._opening is not None and self._opening.future.done():
            self._take_opened()
        return self._keeper is not None

    @property
    def busy(self) -> bool:
        """A write was begun and its result not taken yet."""
        return self._keeper is not None and self._keeper.busy

    @property
    def finished(self) -> bool:
        """The write under way is done: `result` will not wait."""
        return self._keeper is not None and self._keeper.finished

    def open(self) -> None:
        """Start opening the connection, once a drain; `active` tells when it is open."""
        if self._keeper is None and self._opening is None and not self._refused:
            self._opening = _Opening(self._open_keeper)

    def _open_keeper(self) -> ConnectionKeeper:
        return ConnectionKeeper(
            self._database.connect(), self._database, self._log, self._observers
        )

    def _take_opened(self) -> None:
        opening, self._opening = self._opening, None
        assert opening is not None
        error = opening.future.exception()
        if error is None:
            self._keeper = opening.future.result()
            return
        if not isinstance(error, JobrunnerError | OSError):
            raise error  # not the database's refusal: a fault, raised where it shows
        self._refused = True
        self._log.info(
            "writing outcomes through the tick's one connection: a second one could not be opened",
            error=describe(error),
        )

    def begin(
        self,
        decisions: list[Decision],
        write: Callable[[Any], set[int]],
        *,
        then: Callable[[], None],
    ) -> None:
        """Start `write(connection)`, which writes `decisions`, on its own thread."""
        assert self._keeper is not None
        self._writing = decisions
        self._keeper.begin("finalize", write, then=then)

    def result(self) -> tuple[list[Decision], set[int]]:
        """The decisions written and the ids whose lease was still held, once the write is done.

        Raises `StatementFailed` when the decisions were not written, as far as the tick
        knows: they stay in the batcher's buffer. If the connection was lost and cannot be
        re-opened, the writer closes: the tick's own connection writes what is left.
        """
        assert self._keeper is not None
        decisions, self._writing = self._writing, []
        try:
            return decisions, self._keeper.result()
        except ReconnectFailed:
            self.close()
            self._refused = True
            raise StatementFailed("finalize") from None

    def close(self) -> None:
        """Close the connection, once the write under way, if any, has ended.

        Its decisions stay in the batcher's buffer: nothing reads the write's result
        here, so a failed one reconnects nothing.
        """
        if self._opening is not None:
            # Not waited for: a connect to a server that does not answer may take seconds
            # past --grace. Whatever it opens, its own thread closes.
            self._opening.abandon()
            self._opening = None
        keeper, self._keeper = self._keeper, None
        if keeper is None:
            return
        keeper.wait_out()
        _close(keeper)


class _Opening:
    """The writer's connection, being opened on a thread of its own."""

    def __init__(self, open_keeper: Callable[[], ConnectionKeeper]) -> None:
        self.future: Future[ConnectionKeeper] = Future()
        threading.Thread(
            target=self._open, args=(open_keeper,), name="jobrunner-writer-connect", daemon=True
        ).start()

    def abandon(self) -> None:
        """The drain is over: the connection is closed as soon as it is open, if ever."""
        self.future.add_done_callback(_close_opened)

    def _open(self, open_keeper: Callable[[], ConnectionKeeper]) -> None:
        try:
            self.future.set_result(open_keeper())
        except BaseException as exc:  # connect translates the driver's errors; taken on the
            self.future.set_exception(exc)  # main thread, which tells a refusal from a fault


def _close(keeper: ConnectionKeeper) -> None:
    with contextlib.suppress(Exception):  # a broken connection has nothing left to release
        keeper.conn.close()


def _close_opened(future: Future[ConnectionKeeper]) -> None:
    if future.exception() is None:
        _close(future.result())
