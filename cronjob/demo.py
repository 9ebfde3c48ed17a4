"""Built-in example handlers for `jobrunner demo`."""

from __future__ import annotations

from typing import Any

from cronjob.handlers import Backoff, Fail, handler

# No backoff: a failed attempt's retry is due at once. The tick retries it before it ends
# only if other runs were still running when it found nothing more due, so the demo shows
# it failed (to be retried) or succeeded on a later attempt, as the machine's pace has it.
_IMMEDIATE = Backoff(base=0, cap=0)


@handler("demo.greet", max_attempts=3, backoff=_IMMEDIATE)
def greet(ctx: Any, payload: dict[str, Any]) -> None:
    ctx.log.info("hello", name=payload.get("name", "world"))


@handler("demo.flaky", max_attempts=3, backoff=_IMMEDIATE)
def flaky(ctx: Any, payload: dict[str, Any]) -> None:
    if ctx.attempt == 1:
        raise ConnectionError("the mail server hung up (it will work next time)")
    ctx.log.info("sent on a later attempt", attempt=ctx.attempt)


@handler("demo.broken", max_attempts=2, backoff=_IMMEDIATE)
def broken(ctx: Any, payload: dict[str, Any]) -> None:
    if payload.get("permanent"):
        raise Fail("the account was deleted: nothing to retry")
    raise ValueError(f"cannot parse invoice {payload.get('invoice')!r}")


# The demo's tenants: any query whose first column is a tenant id will do.
DEMO_TENANTS_SQL = "VALUES ('acme'), ('globex'), ('initech')"


@handler("demo.digest", max_attempts=3, backoff=_IMMEDIATE)
def digest(ctx: Any, payload: dict[str, Any]) -> None:
    ctx.log.info("digest sent", tenant=ctx.tenant_id, scheduled_for=str(ctx.scheduled_for))
