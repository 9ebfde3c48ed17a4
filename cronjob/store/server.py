"""The server's own state, beside the queue's tables (queries.server)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from cronjob.models import HeldLock, HolderKind, SnapshotHolder
from cronjob.queries import server as queries
from cronjob.text import one_line, redact

# A holder's query, as shown: its start, enough to recognise it; a query's literals are
# anyone's data, so no more of them than that leaves the database.
QUERY_CHARS = 100


def server_list_snapshot_holders(
    conn: Any, *, limit: int = 100, now: datetime | None = None
) -> list[SnapshotHolder]:
    """What holds back cleanup of the queue's database, oldest first; those whose age this
    role cannot see last, the furthest behind first."""
    rows = conn.cursor(row_factory=dict_row).execute(
        queries.SERVER_LIST_SNAPSHOT_HOLDERS, {"limit": limit, "now": now}
    )
    return [_holder(**row) for row in rows.fetchall()]


def _holder(*, kind: str, user_name: str | None, query: str | None, **row: Any) -> SnapshotHolder:
    shown = one_line(redact(query), limit=QUERY_CHARS) if query else None
    return SnapshotHolder(kind=HolderKind(kind), user=user_name, query=shown or None, **row)


def server_list_advisory_locks(
    conn: Any, *, limit: int = 100, now: datetime | None = None
) -> list[HeldLock]:
    """Who holds jobrunner's advisory locks in the queue's database, the longest held first."""
    rows = conn.cursor(row_factory=dict_row).execute(
        queries.SERVER_LIST_ADVISORY_LOCKS, {"limit": limit, "now": now}
    )
    return [HeldLock(user=row.pop("user_name"), **row) for row in rows.fetchall()]


def session_read_only(conn: Any) -> bool:
    """True if a transaction on `conn` cannot write: a standby, or a server (or database,
    or role) with default_transaction_read_only on."""
    return conn.execute(queries.SESSION_READ_ONLY).fetchone()[0] == "on"
