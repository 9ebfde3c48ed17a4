"""A handler during which the database driver logs, as it does after a lost connection."""

from __future__ import annotations

import logging
from typing import Any

from cronjob import handler


@handler("noise.driver")
def driver_noise(ctx: Any, payload: Any) -> None:
    logging.getLogger("psycopg").warning(
        "error ignored terminating %r: %s", "<psycopg.Pipeline [BAD]>", "the connection is lost"
    )
