"""The listener: what a tick that stays (`tick --listen`) does while it has nothing to do.

The drain asks it, when nothing is in flight and the last claim came back short
(`Listener.idle`), what to do next, and it answers once something may be claimable:
`Wake.CLAIM` (notified, polled, or a delayed run or a rate window fell due), `Wake.TIME`
(a schedule's time came: materialize, then claim) or `Wake.STOP` (the deadline passed, or
a signal came). While handlers run and the last claim came back short, the drain asks it
between passes whether to claim again (`Listener.between`), without waiting.

Its states, and what moves it between them:

    state     | enqueuers                          | moves to  | when
    ----------+------------------------------------+-----------+------------------------------
    awake     | send nothing (nobody sleeps)       | armed     | the drain has nothing to do:
              |                                    |           | takes the sleeper's lock, then
              |                                    |           | claims once more
    armed     | notify (one per transaction)       | lingering | woken at once, time after time:
              |                                    |           | runs come faster than it can
              |                                    |           | sleep; releases the lock
    lingering | send nothing                       | armed     | its polls claim fewer than
              |                                    |           | LINGER_RATE runs a second
              |                                    |           | (`Linger`)
    polling   | send nothing (LISTEN cannot work   | —         | (for the tick's whole life)
              | through its connection)            |           |

Armed, it sleeps in `select` on its connection's socket (and on a pipe a signal writes
to) until a notification, the next due time, the deadline or `REFRESH`: no statement
runs while it sleeps. An enqueue that saw no sleeper sent nothing, and may still commit: once
it holds its lock, the tick notes the transactions open (`transactions_open`), and while one
of them lasts it looks again after `QUIET_PAUSES` rather than sleep on.

Its parts: `Channel`, the connection it hears notifications on and the pipe a signal
writes to (what wakes it from `select`); `Linger`, when it polls rather than sleeps. Only
the connection keeper it is given touches its connection: the tick's own, or one of its own
when `--listen-database-url` names a direct session beside a pooled one. A lost
connection is re-opened with backoff until the deadline; LISTEN and the sleeper's locks
are taken again on the new one, and the drain claims what came meanwhile.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import os
import select
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import pq

from cronjob import store
from cronjob.settings import LISTENING_TICK_STALE
from cronjob.store.listen import NextDue
from cronjob.tick.connection import ConnectionKeeper, ReconnectFailed, StatementFailed

if TYPE_CHECKING:
    from cronjob.tick.shutdown import Shutdown

POLL_INTERVAL = 1.0  # seconds between claims of a tick that cannot listen
PREPARE_THRESHOLD = 2  # executions of a statement on a listening connection before it is prepared
# By default a listening tick stays to the end of the database clock's minute and this long
# into the next: cron has started the next minute's tick by then, so no second is left
# without one, and with --grace below 60 - OVERLAP no more than two of a host's are alive.
OVERLAP = 10.0
REFRESH = 20.0  # the longest a sleep lasts: the tick's row in job_ticks is refreshed then
# Woken at once (the socket was readable already) this many times in a row: runs come faster
# than the tick sleeps and wakes. It lingers instead (`Linger`): polls every LINGER_POLL (more
# slowly, up to LINGER_POLL_MAX, while its polls find nothing), for as long as it claims at
# least LINGER_RATE runs a second over each LINGER_FOR; so that no enqueue pays for a
# notification meanwhile. Below that rate a notification costs the enqueuers nothing that
# counts, and sleeping starts runs sooner than polling. Made to linger again soon after it
# stopped, it lingers twice as long before it looks at its rate, up to LINGER_MAX (a tick
# woken at once again and again for runs it does not handle claims none); a wake-up after
# CALM seconds of sleep starts over.
LINGER_AFTER = 3
AT_ONCE = 0.001
LINGER_POLL = 0.002
LINGER_POLL_MAX = 0.02
LINGER_FOR = 0.05
LINGER_RATE = 250.0
LINGER_MAX = 2.0
CALM = 0.1
DUE_MARGIN = 0.001  # a timed wake-up comes this long after the time it waits for
# After "not quiet": when the tick looks again, while transactions that may have missed it
# are still open (the pauses repeat the last one).
QUIET_PAUSES = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
# After a lost connection could not be re-opened: when it tries again, until the deadline.
RECONNECT_PAUSES = (0.5, 1.0, 2.0, 5.0)


class Wake(enum.Enum):
    CLAIM = "claim"  # something may be claimable
    TIME = "time"  # a schedule's time came: materialize, then claim
    STOP = "stop"  # the deadline passed, or a signal came


class Listener:
    """A listening (or polling) tick's waits between claims, on the keeper it is given."""

    def __init__(
        self,
        keeper: ConnectionKeeper,
        *,
        job_types: Sequence[str],
        shutdown: Shutdown,
        worker: str,
        log: Any,
        poll_interval: float | None = None,
        now: datetime | None = None,
        owns_connection: bool = False,
        tick_id: int | None = None,
    ) -> None:
        self.keeper = keeper
        self._owns_connection = owns_connection
        self.polling = poll_interval is not None
        self.poll_interval = poll_interval or POLL_INTERVAL
        self._types = list(job_types)
        self._shutdown = shutdown
        self._log = log
        self._now = now
        self._channel = Channel(keeper, shutdown, listening=not self.polling)
        self._armed = self._awaiting_finishes = False
        # The transactions open when it took its lock, until each has ended: one may have
        # made runs claimable, seen nobody asleep and sent nothing (migration 0027).
        self._open: list[int] = []
        self._quiet_pause = 0
        self._linger = Linger()
        self._last_poll = 0.0
        self._since: datetime | None = None  # when the tick last materialized (database clock)
        self._row = TickRow(tick_id, worker, now=now)

    # -- what the drain asks ---------------------------------------------------

    def start(self) -> None:
        """LISTEN (unless polling) and enter the tick in job_ticks; after a startup step."""
        self._check_connection()
        interval = self.poll_interval if self.polling else None
        # Schedules due from its start on are its own to materialize (`_since`).
        self._since = self.keeper.run("listen", lambda conn: self._row.enter(conn, interval))

    def idle(self, deadline: float, *, claimed: int) -> Wake:
        """Nothing in flight and nothing claimable: wait for something to do.

        `claimed`: the runs the drain claimed since it last asked.
        """
        if claimed:
            self._linger.claimed(claimed)
        try:
            while True:
                now = time.monotonic()
                if self._shutdown.requested or now >= deadline:
                    return Wake.STOP
                wake = self._idle(deadline, now)
                # Its last claims found nothing: maybe it is woken by runs of types it does not
                # handle. A question of its own types, type by type, costs little whatever
                # waits of others' (a claim walks every type's waiting runs).
                if wake is not Wake.CLAIM or claimed or self.keeper.run("due", self._due):
                    return wake
        except StatementFailed as failed:
            if not failed.retryable:
                raise
            return self._reset()
        except ReconnectFailed as exc:
            return self._reconnect(deadline, str(exc))

    def between(self, now: float) -> bool:
        """Handlers run and the last claim came back short: whether to claim again now."""
        try:
            return self._between(now)
        except StatementFailed as failed:
            if not self._owns_connection or not failed.retryable:
                raise  # on the tick's own connection, the drain decides as for its own
            self._reset()
            return True  # what came while it could not hear, claimed at once
        except ReconnectFailed:
            if not self._owns_connection:
                raise
            return False  # its own connection: idle() tries again, with backoff

    def _between(self, now: float) -> bool:
        if self.polling or self._linger.active:
            pause = self._linger.pause if self._linger.active else self.poll_interval
            due = now - self._last_poll >= pause
            if due:
                self._last_poll = now
            return due
        self._check_connection()
        if not self._armed:
            self._arm()
            return True  # the claim after arming
        return self._channel.pending(0.0)

    def close(self) -> None:
        """Leave job_ticks, unlisten, release the sleeper's locks; failures change nothing."""
        self._channel.close()
        conn = self.keeper.conn
        if not (conn.closed or conn.broken):
            with contextlib.suppress(Exception):  # the tick is over; its row is pruned if left
                self.keeper.run("listen", self._leave)
        if self._owns_connection:
            with contextlib.suppress(Exception):
                self.keeper.conn.close()

    # -- its states --------------------------------------------------------------

    def _idle(self, deadline: float, now: float) -> Wake:
        self._check_connection()
        if self._row.touch_due(now):
            self.keeper.run("listen", self._row.touch)
        if self.polling:
            return self._wait_for_time(deadline, self.poll_interval)
        if self._linger.active:
            pause = self._linger.next_pause(now)
            if pause is not None:
                return self._wait_for_time(deadline, pause)
        if not self._armed:
            self._arm()
            return Wake.CLAIM  # what committed before the lock was taken
        due = self.keeper.run("next due", self._next_due)
        if due.held_back and not self._awaiting_finishes:
            opened = self.keeper.run("sleep", lambda conn: _sleep(conn, awaiting_finishes=True))
            self._open = sorted({*self._open, *opened})
            self._awaiting_finishes = True
            return Wake.CLAIM
        return self._sleep(deadline, due)

    def _sleep(self, deadline: float, next_due: NextDue) -> Wake:
        now = time.monotonic()
        until = min(deadline, now + REFRESH)
        timed = False
        if next_due.due_at is not None:
            # Just past it, not before: the claim compares the run's time with its own clock.
            due = now + max(0.0, (next_due.due_at - next_due.now).total_seconds()) + DUE_MARGIN
            if due < until:
                until, timed = due, True
        quiet_pause = None
        if self._open:
            quiet_pause = QUIET_PAUSES[min(self._quiet_pause, len(QUIET_PAUSES) - 1)]
            self._quiet_pause += 1
        woken = self._channel.pending(min(until - now, quiet_pause) if quiet_pause else until - now)
        if self._shutdown.requested:
            return Wake.STOP
        if woken:
            self._woken(time.monotonic() - now)
            return Wake.CLAIM
        now = time.monotonic()
        if quiet_pause is not None and now < until:
            still = self._open
            self._open = self.keeper.run("sleep", lambda c: store.transactions_open(c, still))
            return Wake.CLAIM  # what those that ended may have committed
        if now >= deadline:
            return Wake.STOP
        if timed and next_due.schedule_at == next_due.due_at:
            self._since = next_due.schedule_at
            return Wake.TIME
        return Wake.CLAIM  # a run or a rate window fell due, or REFRESH: look again

    def _woken(self, slept: float) -> None:
        """Notified after `slept` seconds: at once too often, and it lingers instead."""
        if self._linger.woken(slept, time.monotonic()):
            self._disarm()

    def _wait_for_time(self, deadline: float, pause: float) -> Wake:
        now = time.monotonic()
        self._channel.wait(min(pause, deadline - now))
        self._last_poll = time.monotonic()
        if self._shutdown.requested or self._last_poll >= deadline:
            return Wake.STOP
        if self.polling:
            # A polling tick asks for due schedules too, as a listening one does.
            due = self.keeper.run("next due", self._next_due)
            if due.schedule_at is not None and due.schedule_at <= due.now:
                self._since = due.schedule_at
                return Wake.TIME
            self._since = due.now  # the next poll asks for what falls due from here on
        return Wake.CLAIM

    def _arm(self) -> None:
        self._open = self.keeper.run("sleep", _sleep)
        self._quiet_pause = 0
        self._armed = True

    def _disarm(self) -> None:
        finishes = self._awaiting_finishes

        def wake(conn: Any) -> None:
            store.tick_wake(conn)
            if finishes:
                store.tick_wake(conn, finishes=True)

        self.keeper.run("wake", wake)
        self._armed = self._awaiting_finishes = False

    def _due(self, conn: Any) -> bool:
        return store.runs_exist_due(conn, self._types, now=self._now)

    def _next_due(self, conn: Any) -> Any:
        return store.runs_get_next_due(conn, self._types, since=self._since, now=self._now)

    # -- the connection ------------------------------------------------------------

    def _check_connection(self) -> None:
        """LISTEN again on a connection the keeper re-opened: the locks went with the old."""
        if self._channel.setup():
            self._armed = self._awaiting_finishes = False
            self._linger.active = False

    def _reset(self) -> Wake:
        """The connection was lost and re-opened: listen on the new one, and claim what
        came meanwhile."""
        self._check_connection()
        return Wake.CLAIM

    def _reconnect(self, deadline: float, error: str) -> Wake:
        """The connection was lost and could not be re-opened: try again, with backoff,
        until the deadline or a signal."""
        for attempt in itertools.count():
            pause = RECONNECT_PAUSES[min(attempt, len(RECONNECT_PAUSES) - 1)]
            self._log.warning("listening: the database is unreachable", error=error, retry_in=pause)
            self._channel.wait(min(pause, deadline - time.monotonic()))
            if self._shutdown.requested or time.monotonic() >= deadline:
                return Wake.STOP
            try:
                self.keeper.run("listen", store.tick_listen)
            except StatementFailed:
                pass  # re-opened: what failed was the statement on the old connection
            except ReconnectFailed as exc:
                error = str(exc)
                continue
            return self._reset()
        raise AssertionError("unreachable")

    def _leave(self, conn: Any) -> None:
        self._row.leave(conn)
        if self._channel.listens_on(conn):
            store.tick_unlisten(conn)
            if self._armed:
                store.tick_wake(conn)
            if self._awaiting_finishes:
                store.tick_wake(conn, finishes=True)


class Channel:
    """The connection a listener hears notifications on (the keeper's, whichever it holds
    now), and the pipe a signal writes to: what wakes a tick that sleeps in `select`."""

    def __init__(self, keeper: ConnectionKeeper, shutdown: Shutdown, *, listening: bool) -> None:
        self.keeper = keeper
        self._shutdown = shutdown
        self._listening = listening
        self._conn: Any = None  # the connection LISTEN is on
        self._notices = 0  # notifications received so far
        self._seen = 0  # of which the tick has acted on
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        os.set_blocking(self._wake_read, False)
        shutdown.wakers.append(self._wake_up)

    def setup(self) -> bool:
        """LISTEN on the keeper's connection as it is now; True if that is a new one."""
        conn = self.keeper.conn
        if conn is self._conn:
            return False
        self._conn = conn
        if self._listening:
            conn.add_notify_handler(self._notified)
            self.keeper.run("listen", store.tick_listen)
            # A direct session (LISTEN works on it): its statements, the claims first of all,
            # are planned once rather than every time, as no pooler hands it to others.
            conn.prepare_threshold = PREPARE_THRESHOLD
        return True

    def listens_on(self, conn: Any) -> bool:
        return self._listening and conn is self._conn

    def pending(self, timeout: float) -> bool:
        """Whether a notification came (or comes within `timeout`), which it then takes:
        waits on the socket and on the signal pipe, and runs no statement unless the socket
        has something to read."""
        until = time.monotonic() + max(0.0, timeout)
        while self._notices == self._seen:
            if self._shutdown.requested:
                return False
            remaining = max(0.0, until - time.monotonic())
            fd = self._conn.fileno()
            readable, _, _ = select.select([fd, self._wake_read], [], [], remaining)
            if self._wake_read in readable:
                self._drain_pipe()
                continue
            if fd in readable:
                self.keeper.run("notifications", self._receive)
                continue
            return False
        self._seen = self._notices
        return True

    def wait(self, timeout: float) -> None:
        """Sleep `timeout` seconds unless a signal comes first."""
        if timeout > 0 and not self._shutdown.requested:
            readable, _, _ = select.select([self._wake_read], [], [], timeout)
            if readable:
                self._drain_pipe()

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self._shutdown.wakers.remove(self._wake_up)
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _receive(self, conn: Any) -> None:
        """Read what the server sent; count its notifications."""
        pgconn = conn.pgconn
        pgconn.consume_input()
        while pgconn.notifies() is not None:
            self._notices += 1
        if pgconn.status != pq.ConnStatus.OK:
            raise psycopg.OperationalError("the connection to the database was lost")

    def _notified(self, _notify: Any) -> None:
        # On whichever thread runs a statement on the connection (the drain's claims).
        self._notices += 1

    def _drain_pipe(self) -> None:
        with contextlib.suppress(OSError):
            os.read(self._wake_read, 512)

    def _wake_up(self) -> None:
        with contextlib.suppress(OSError):  # full: a byte is there already
            os.write(self._wake_write, b"\0")


class Linger:
    """When a tick polls rather than sleeps: the "lingering" state of the module's table."""

    def __init__(self) -> None:
        self.active = False
        self.pause = LINGER_POLL  # until the next poll
        self._span = LINGER_FOR  # how long it polls before it looks at its rate
        self._at_once = 0  # wake-ups in a row that came at once
        self._since = 0.0  # when the span under way began
        self._runs = 0  # claimed in it
        self._left_at = float("-inf")

    def woken(self, slept: float, now: float) -> bool:
        """A wake-up after `slept` seconds; True if the tick starts to linger."""
        if slept >= CALM:
            self._span = LINGER_FOR
        self._at_once = self._at_once + 1 if slept < AT_ONCE else 0
        if self._at_once < LINGER_AFTER:
            return False
        self._at_once = 0
        if now - self._left_at < 2 * self._span:
            self._span = min(2 * self._span, LINGER_MAX)
        self.active, self.pause, self._since, self._runs = True, LINGER_POLL, now, 0
        return True

    def claimed(self, runs: int) -> None:
        self._runs += runs
        self.pause = LINGER_POLL

    def next_pause(self, now: float) -> float | None:
        """How long until the next poll; None once it claims too few runs to go on polling."""
        elapsed = now - self._since
        if elapsed >= self._span:
            if self._runs < LINGER_RATE * elapsed:
                self.active, self._left_at = False, now
                return None
            self._since, self._runs = now, 0
        pause, self.pause = self.pause, min(1.5 * self.pause, LINGER_POLL_MAX)
        return pause


def _sleep(conn: Any, *, awaiting_finishes: bool = False) -> list[int]:
    """Take the sleeper's lock, then note the transactions open (in a statement of its own:
    a snapshot taken after the lock is held)."""
    store.tick_sleep(conn, awaiting_finishes=awaiting_finishes)
    return store.transactions_open(conn)


class TickRow:
    """A listening tick's row in job_ticks: the one `jobrunner tick` entered (kept when it
    ends), else one of its own, entered at start and deleted when it leaves. Touched every
    REFRESH, so that a tick killed meanwhile is seen as lost."""

    def __init__(self, tick_id: int | None, worker: str, *, now: datetime | None) -> None:
        self.id, self._own = tick_id, tick_id is None
        self._worker, self._now = worker, now
        self._touched = 0.0

    def enter(self, conn: Any, poll_interval: float | None) -> datetime:
        """Mark the row listening (or polling), and return when that was, by the database."""
        store.ticks_prune(conn, stale=LISTENING_TICK_STALE)
        if self._own:
            host, pid = self._worker.rsplit(":", 1)
            entered = store.ticks_insert(conn, host=host, pid=int(pid), poll_interval=poll_interval)
        else:
            entered = store.ticks_listen(conn, self.id, poll_interval=poll_interval)
        self.id, since = entered
        self._touched = time.monotonic()
        return since

    def touch_due(self, now: float) -> bool:
        return self.id is not None and now - self._touched >= REFRESH

    def touch(self, conn: Any) -> None:
        store.ticks_touch(conn, self.id, now=self._now)
        self._touched = time.monotonic()

    def leave(self, conn: Any) -> None:
        if self.id is not None and self._own:
            store.ticks_delete(conn, self.id)
