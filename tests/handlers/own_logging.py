"""A handler module whose app sets its own logging up when it is imported, as
`logging.basicConfig` does in many scripts."""

from __future__ import annotations

import logging
import sys
from typing import Any

from cronjob import handler

logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="APP %(levelname)s %(message)s")


@handler("logs.own_setup")
def own_setup(ctx: Any, payload: Any) -> None:
    logging.getLogger("shop").info("in the app's own format")
