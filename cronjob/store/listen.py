"""Starting promptly, as models: what a listening tick and `jobrunner wait` ask while they
wait. The statements are queries.listen."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import class_row

from cronjob.models import TERMINAL, Status
from cronjob.queries import listen as queries


@dataclass(frozen=True)
class NextDue:
    """When a sleeping tick has something to do without being told (queries.listen)."""

    now: datetime  # the database clock, when asked
    due_at: datetime | None  # the earliest run, schedule or rate window after now; None: none
    schedule_at: datetime | None  # the earliest of them a schedule's (it is then materialized)
    held_back: bool  # a due run of its types waits for a limit or a running sibling


@dataclass(frozen=True)
class ListeningTick:
    """A tick that stays (`tick --listen`): listening since when, or polling and how often."""

    host: str
    pid: int
    started_at: datetime
    listening_since: datetime | None  # None: it polls
    poll_interval: float | None
    last_seen: datetime


@dataclass(frozen=True)
class RecentTick:
    """A run of `jobrunner tick` (migration 0028): when, where, and what it did; the counts
    are None until it ends."""

    host: str
    pid: int
    started_at: datetime
    ended_at: datetime | None  # None: still running (or killed, and not yet seen as lost)
    last_seen: datetime
    listening_since: datetime | None
    poll_interval: float | None
    stopped_by: str | None  # None: it drained what was due; 'idle', 'lost', 'max-runtime', ...
    materialized: int | None
    rescued: int | None
    claimed: int | None
    succeeded: int | None
    failed: int | None
    dead: int | None


@dataclass(frozen=True)
class TickHost:
    """A host that ticked in the last hour: when last, and how many of its ticks were idle."""

    host: str
    last_started: datetime
    idle: int
    ticks: int


@dataclass(frozen=True)
class RunOutcome:
    """A run as `jobrunner wait` reports it: its status, and when it finished if it has."""

    id: int
    status: Status
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL


def tick_listen(conn: Any) -> None:
    conn.execute(queries.TICK_LISTEN)


def tick_unlisten(conn: Any) -> None:
    conn.execute(queries.TICK_UNLISTEN)


def session_is_pooled(conn: Any) -> bool:
    """Whether `conn` reaches the server through a pooler: the session that answers is not
    the one the connection was told it talks to."""
    backend = conn.execute(queries.SESSION_IS_POOLED_BACKEND_PID).fetchone()[0]
    return int(backend) != conn.info.backend_pid


def tick_sleep(conn: Any, *, awaiting_finishes: bool = False) -> None:
    """This session sleeps from now on (or, `awaiting_finishes`, wants to hear of finishes)."""
    conn.execute(queries.TICK_SLEEP_AWAITING_FINISHES if awaiting_finishes else queries.TICK_SLEEP)


def transactions_open(conn: Any, among: Sequence[int] | None = None) -> list[int]:
    """The transactions open now (ids, as this statement's snapshot sees them); with `among`,
    those of them still open."""
    if among is None:
        return [row[0] for row in conn.execute(queries.TRANSACTIONS_OPEN).fetchall()]
    if not among:
        return []
    rows = conn.execute(queries.TRANSACTIONS_OPEN_STILL, {"xids": list(among)}).fetchall()
    return [row[0] for row in rows]


async def transactions_open_async(conn: Any, among: Sequence[int] | None = None) -> list[int]:
    if among is None:
        cursor = await conn.execute(queries.TRANSACTIONS_OPEN)
    elif not among:
        return []
    else:
        cursor = await conn.execute(queries.TRANSACTIONS_OPEN_STILL, {"xids": list(among)})
    return [row[0] for row in await cursor.fetchall()]


def tick_wake(conn: Any, *, finishes: bool = False) -> None:
    conn.execute(queries.TICK_WAKE_FINISHES if finishes else queries.TICK_WAKE)


def runs_get_next_due(
    conn: Any,
    job_types: Iterable[str],
    *,
    since: datetime | None = None,
    now: datetime | None = None,
) -> NextDue:
    params = {"job_types": list(job_types), "since": since, "now": now}
    cursor = conn.cursor(row_factory=class_row(NextDue))
    return cursor.execute(queries.RUNS_GET_NEXT_DUE, params).fetchone()


def runs_exist_due(conn: Any, job_types: Iterable[str], *, now: datetime | None = None) -> bool:
    """Whether a run of `job_types` (less the paused) is due, asked type by type."""
    params = {"job_types": list(job_types), "now": now}
    return bool(conn.execute(queries.RUNS_EXIST_DUE, params).fetchone()[0])


def tick_listen_until(conn: Any, *, overlap: float, now: datetime | None = None) -> float:
    """Seconds to the end of the database clock's minute, plus `overlap`."""
    params = {"overlap": overlap, "now": now}
    return float(conn.execute(queries.TICK_LISTEN_UNTIL, params).fetchone()[0])


def ticks_insert(
    conn: Any, *, host: str, pid: int, poll_interval: float | None, now: datetime | None = None
) -> tuple[int, datetime]:
    """Enter a tick that stays; its row's id, and when it started (the database clock)."""
    params = {"host": host, "pid": pid, "poll_interval": poll_interval, "now": now}
    tick_id, started_at = conn.execute(queries.TICKS_INSERT, params).fetchone()
    return int(tick_id), started_at


def ticks_listen(
    conn: Any, tick_id: int, *, poll_interval: float | None, now: datetime | None = None
) -> tuple[int, datetime]:
    """Mark the row `jobrunner tick` entered as a tick that stays (listening, or polling every
    `poll_interval` seconds); its id, and now (the database clock)."""
    params = {"id": tick_id, "poll_interval": poll_interval, "now": now}
    found, at = conn.execute(queries.TICKS_LISTEN, params).fetchone()
    return int(found), at


def ticks_end(
    conn: Any,
    tick_id: int,
    *,
    stopped_by: str | None,
    counts: dict[str, int],
    kept: float,
    now: datetime | None = None,
) -> None:
    """What the tick did (`counts`: materialized, rescued, claimed, succeeded, failed,
    dead), once it ends; ended rows older than `kept` seconds go, a few at a time."""
    params = {"id": tick_id, "stopped_by": stopped_by, "kept": kept, "now": now, **counts}
    conn.execute(queries.TICKS_END, params)


def ticks_list_recent(conn: Any, *, limit: int, now: datetime | None = None) -> list[RecentTick]:
    cursor = conn.cursor(row_factory=class_row(RecentTick))
    return cursor.execute(queries.TICKS_LIST_RECENT, {"limit": limit, "now": now}).fetchall()


def ticks_count_idle_by_host(conn: Any, *, now: datetime | None = None) -> list[TickHost]:
    cursor = conn.cursor(row_factory=class_row(TickHost))
    return cursor.execute(queries.TICKS_COUNT_IDLE_BY_HOST, {"now": now}).fetchall()


def ticks_touch(conn: Any, tick_id: int, *, now: datetime | None = None) -> None:
    conn.execute(queries.TICKS_TOUCH, {"id": tick_id, "now": now})


def ticks_delete(conn: Any, tick_id: int) -> None:
    conn.execute(queries.TICKS_DELETE, {"id": tick_id})


def ticks_prune(conn: Any, *, stale: float, now: datetime | None = None) -> None:
    conn.execute(queries.TICKS_PRUNE, {"stale": stale, "now": now})


def ticks_list(conn: Any, *, stale: float, now: datetime | None = None) -> list[ListeningTick]:
    cursor = conn.cursor(row_factory=class_row(ListeningTick))
    return cursor.execute(queries.TICKS_LIST, {"stale": stale, "now": now}).fetchall()


def runs_wait_begin(conn: Any) -> None:
    """This session listens, and wants to hear of runs that finish from now on."""
    conn.execute(queries.RUNS_WAIT_BEGIN_LISTEN)
    conn.execute(queries.RUNS_WAIT_BEGIN)


async def runs_wait_begin_async(conn: Any) -> None:
    await conn.execute(queries.RUNS_WAIT_BEGIN_LISTEN)
    await conn.execute(queries.RUNS_WAIT_BEGIN)


def runs_wait_end(conn: Any) -> None:
    conn.execute(queries.RUNS_WAIT_END)


async def runs_wait_end_async(conn: Any) -> None:
    await conn.execute(queries.RUNS_WAIT_END)


def runs_list_outcomes(conn: Any, ids: Sequence[int]) -> list[RunOutcome]:
    cursor = conn.cursor(row_factory=class_row(RunOutcome))
    return cursor.execute(queries.RUNS_LIST_OUTCOMES, {"ids": list(ids)}).fetchall()


async def runs_list_outcomes_async(conn: Any, ids: Sequence[int]) -> list[RunOutcome]:
    cursor = conn.cursor(row_factory=class_row(RunOutcome))
    await cursor.execute(queries.RUNS_LIST_OUTCOMES, {"ids": list(ids)})
    return await cursor.fetchall()
