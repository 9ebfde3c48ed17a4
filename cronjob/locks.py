"""Waiting for a lock that another host holds: migrations, schedule syncs, keyed batches;
and who holds jobrunner's locks, as `status` shows them.

These locks are transaction-scoped advisory locks that a host holds for as long as its
migration, sync or batch takes, which can be minutes. A host that finds one taken says so
in its log and waits for as long as the caller allows, instead of the runner's 5-second
`lock_timeout` meant for row locks, which would fail it whenever the first host was slow.

One is waited for differently: the lock a migration that cannot run in a transaction
(`CREATE INDEX CONCURRENTLY`) is applied under. A host asks for it, and if another host
holds it, ends its transaction and asks again a moment later (`holding`), never waiting
inside a statement: a concurrent index build waits for every transaction whose snapshot is
older than its own, and a host blocked on the lock inside a statement would hold such a
snapshot while waiting for the host that builds, which then waits for it in turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from cronjob.errors import DatabaseError, JobrunnerError

if TYPE_CHECKING:
    from cronjob.models import HeldLock

# Long enough for any migration or sync; a host still waiting then is stuck behind
# something an operator should look at.
DEFAULT_LOCK_WAIT = 600.0

# How often a host waiting without a statement (`holding`) asks again.
POLL_INTERVAL = 0.2

# SQLSTATEs of a wait cut short by lock_timeout and by statement_timeout.
_LOCK_NOT_AVAILABLE = "55P03"
_QUERY_CANCELED = "57014"


class LockWaitExpired(JobrunnerError):
    """Another host held the lock for longer than this one was allowed to wait."""


def take(conn: Any, lock: Callable[..., bool], *, what: str, wait: float) -> None:
    """Take `lock` (a store function with a `wait` flag) in the caller's transaction,
    waiting at most `wait` seconds for another host to release it."""
    from cronjob import store
    from cronjob.db import database_errors

    if lock(conn, wait=False):
        return
    from cronjob import log
    from cronjob.health import seconds_text

    log.info(f"waiting for another host's {what}", lock=what, wait_limit=seconds_text(wait))
    try:
        with database_errors():
            store.lock_wait_limits(conn, wait)
            lock(conn, wait=True)
            store.lock_wait_limits(conn, None)
    except DatabaseError as exc:
        if exc.sqlstate not in (_LOCK_NOT_AVAILABLE, _QUERY_CANCELED):
            raise
        raise LockWaitExpired(
            f"gave up waiting for another host's {what} after {seconds_text(wait)} "
            "(--lock-wait sets how long to wait)"
        ) from None


@contextmanager
def holding(conn: Any, lock: Callable[..., bool], *, what: str, wait: float) -> Iterator[None]:
    """Inside a transaction of `conn` that holds `lock` (a store function with a `wait` flag):
    a host that finds it taken ends its transaction and asks again every POLL_INTERVAL
    seconds, for at most `wait` seconds."""
    deadline = None
    while True:
        with conn.transaction():
            if lock(conn, wait=False):
                yield
                return
        if deadline is None:
            from cronjob import log
            from cronjob.health import seconds_text

            log.info(f"waiting for another host's {what}", lock=what, wait_limit=seconds_text(wait))
            deadline = time.monotonic() + wait
        elif time.monotonic() >= deadline:
            from cronjob.health import seconds_text

            raise LockWaitExpired(
                f"gave up waiting for another host's {what} after {seconds_text(wait)} "
                "(--lock-wait sets how long to wait)"
            )
        time.sleep(POLL_INTERVAL)


# -- who holds them --

HELD_SHOWN = 10  # held locks `status` names, the longest held first


def read_held(conn: Any, *, now: Any = None) -> list[HeldLock]:
    """Every session holding one of jobrunner's advisory locks, the longest held first: any
    login may take any advisory lock (docs/explanation/security.md), and one that keeps a lock holds
    back what waits for it."""
    from cronjob import store

    return store.server_list_advisory_locks(conn, now=now)


def held_text(lock: HeldLock) -> str:
    """`keyed-batch enqueue: pid 4242 (psql, user mallory, idle in transaction, held 3m)`."""
    from cronjob.health import seconds_text

    parts = [lock.application_name] if lock.application_name else []
    parts.append(f"user {lock.user}" if lock.user else "no user")
    parts.append(lock.state or "state hidden")
    if lock.age is not None:
        parts.append(f"held {seconds_text(lock.age)}")
    elif lock.state is None:
        parts.append("age unknown (another user's session: grant this role pg_read_all_stats)")
    return f"{lock.what}: pid {lock.pid} ({', '.join(parts)})"


def held_json(lock: HeldLock) -> dict[str, Any]:
    return {
        "lock": lock.lock,
        "job_type": lock.job_type,
        "pid": lock.pid,
        "user": lock.user,
        "application_name": lock.application_name,
        "state": lock.state,
        "age_seconds": None if lock.age is None else round(lock.age, 3),
    }
