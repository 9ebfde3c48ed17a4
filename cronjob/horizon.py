"""What holds back cleanup of the queue's database: the oldest snapshot, as `status`,
`metrics` and `check --max-snapshot-age` name it.

VACUUM removes a dead row version only once no transaction can still see it, so the
oldest snapshot still open (the xmin horizon) bounds what it can remove, in every table
of the database at once. Each run leaves dead versions of its row behind in `job_runs`
(its claim and its finalize each write a new one): while a snapshot stays open they pile
up, and every claim walks further through them. The queue falls behind while the load
stays the same, and nothing in the queue says why: this does.

What holds the horizon back comes from the server's views (`queries.server`): sessions
whose transaction holds a snapshot or a transaction id, prepared transactions, and
replication slots that hold an xmin. The oldest is the one whose transaction began first;
one whose age this role cannot see (another user's session without `pg_read_all_stats`,
a slot still in use) comes after those it can, named all the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from cronjob.health import Finding, seconds_text
from cronjob.models import HolderKind, SnapshotHolder

HOLDERS_SHOWN = 5  # holders `status` names, oldest first


def read_holders(conn: Any, *, now: datetime | None = None) -> list[SnapshotHolder]:
    """Every holder of the queue's database's cleanup horizon, oldest first."""
    from cronjob import store

    return store.server_list_snapshot_holders(conn, now=now)


def oldest(holders: Sequence[SnapshotHolder]) -> SnapshotHolder | None:
    """The holder whose age is greatest among those this role can see, if any."""
    return next((h for h in holders if h.age is not None), None)


def xmin_age(holders: Sequence[SnapshotHolder]) -> int:
    """How many transactions the horizon is behind the newest: 0 when nothing holds it."""
    return max((h.xmin_age or 0 for h in holders), default=0)


def describe(holder: SnapshotHolder) -> str:
    """`pid 4242 (psql, user alice, idle in transaction)`: which one it is, on one line."""
    if holder.kind is HolderKind.PREPARED:
        return f'prepared transaction "{holder.name}" (user {holder.user})'
    if holder.kind is HolderKind.SLOT:
        pid = f", pid {holder.pid}" if holder.pid is not None else ""
        return f'replication slot "{holder.name}" ({holder.state}{pid})'
    parts = []
    if holder.jobrunner:
        parts.append(f"jobrunner's own {holder.application_name}")
    elif holder.application_name:
        parts.append(holder.application_name)
    parts.append(f"user {holder.user}" if holder.user else "no user")
    if holder.database:
        parts.append(f"database {holder.database}")
    parts.append(holder.state or "state hidden")
    return f"pid {holder.pid} ({', '.join(parts)})"


def text(holder: SnapshotHolder) -> str:
    """The holder, its age and how far behind it holds the horizon, and its query's start."""
    line = f"{describe(holder)}, {_age_text(holder)}"
    if holder.xmin_age is not None:
        line += f", {holder.xmin_age} transaction(s) behind"
    if holder.query:
        line += f": {holder.query}"
    return line


def _age_text(holder: SnapshotHolder) -> str:
    if holder.age is not None:
        return f"open {_age(holder.age)}"
    if holder.kind is HolderKind.SESSION and not holder.visible:
        return "age unknown (another user's session: grant this role pg_read_all_stats)"
    return "age unknown"


def _age(seconds: float) -> str:
    text = seconds_text(seconds)
    return text if seconds < 60 else f"{text} ({seconds:.0f}s)"


def status_lines(holders: Sequence[SnapshotHolder]) -> list[str]:
    """One line per holder, oldest first; one saying so when nothing holds cleanup back."""
    return [text(h) for h in holders] or ["nothing holds back cleanup"]


def finding(holders: Sequence[SnapshotHolder], limit: float) -> Finding:
    """`check --max-snapshot-age`: breached when the oldest holder is older than `limit`."""
    found = oldest(holders)
    unknown = [h for h in holders if h.age is None]
    if found is not None:
        detail = f"the oldest snapshot: {text(found)}"
    elif unknown:
        detail = "no snapshot this role can see the age of"
    else:
        detail = "nothing holds back cleanup"
    if unknown:
        detail += f"; of unknown age: {'; '.join(text(h) for h in unknown[:2])}"
        if len(unknown) > 2:
            detail += f"; and {len(unknown) - 2} more"
    age = found.age if found is not None and found.age is not None else 0.0
    return Finding("max-snapshot-age", age, limit, age > limit, detail)


def as_json(holder: SnapshotHolder) -> dict[str, Any]:
    return {
        "kind": holder.kind.value,
        "name": holder.name,
        "pid": holder.pid,
        "application_name": holder.application_name,
        "user": holder.user,
        "state": holder.state,
        "database": holder.database,
        "jobrunner": holder.jobrunner,
        "since": holder.since.isoformat() if holder.since else None,
        "age_seconds": None if holder.age is None else round(holder.age, 3),
        "xmin_age": holder.xmin_age,
        "query": holder.query,
        "visible": holder.visible,
    }
