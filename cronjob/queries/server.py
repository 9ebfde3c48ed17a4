"""The server's own state, beside the queue's tables: whether a session takes writes.

Run by cronjob.store.server. Nothing here reads jobrunner's tables, so what it costs
does not grow with them.
"""

from __future__ import annotations

# What libpq's target_session_attrs=read-write asks of a server before it keeps a
# connection: on on a standby, and where default_transaction_read_only is on.
SESSION_READ_ONLY = "SELECT current_setting('transaction_read_only')"
