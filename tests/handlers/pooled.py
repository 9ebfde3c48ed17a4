"""A handler that writes through ctx.db, for runs that go through a connection pooler.

It records a business key with ctx.once and inserts a row in the same transaction,
so a test can see that the handler's transaction and the run's success commit
together when every connection is multiplexed by PgBouncer.
"""

from __future__ import annotations

from typing import Any

from cronjob import handler
from tests.handlers.basic import record


@handler("pooled.write")
def write(ctx: Any, payload: Any) -> None:
    record(ctx)
    if ctx.once(f"pooled:{payload['n']}"):
        ctx.db.execute(
            "INSERT INTO pooled_effects (n, run_id) VALUES (%s, %s)", (payload["n"], ctx.run_id)
        )
