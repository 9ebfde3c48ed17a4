"""Handlers that quote the database URL they were given, as careless code does."""

from __future__ import annotations

import os
from typing import Any

from cronjob import Fail, handler


@handler("test.leak_dsn", max_attempts=1)
def leak_dsn(ctx: Any, payload: Any) -> None:
    dsn = os.environ["JOBRUNNER_DATABASE_URL"]
    ctx.log.info("connecting", dsn=dsn)
    raise RuntimeError(f"cannot reach {dsn}")


@handler("test.leak_dsn_fail")
def leak_dsn_fail(ctx: Any, payload: Any) -> None:
    raise Fail(f"gave up on {os.environ['JOBRUNNER_DATABASE_URL']}")
