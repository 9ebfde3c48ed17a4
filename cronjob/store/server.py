"""The server's own state, beside the queue's tables (queries.server)."""

from __future__ import annotations

from typing import Any

from cronjob.queries import server as queries


def session_read_only(conn: Any) -> bool:
    """True if a transaction on `conn` cannot write: a standby, or a server (or database,
    or role) with default_transaction_read_only on."""
    return conn.execute(queries.SESSION_READ_ONLY).fetchone()[0] == "on"
