"""Handlers that log whatever hostile text there is, through `ctx.log` and the standard
library's `logging`, for the tests that nothing a handler logs can break a finalize or a
line of stderr. Each execution is recorded outside the database (tests/exec_log.py)."""

from __future__ import annotations

import logging
import warnings
from typing import Any

from cronjob import handler
from tests.exec_log import record

# What the poisoned handler logs: a password where the old redaction of encoded text ate
# the quote that closed its JSON string, and the text that JSON, PostgreSQL's jsonb and
# a terminal each choke on.
HOSTILE_TEXTS = [
    "password=hunter2",
    'password="hunter2" and a quote: " and a backslash: \\',
    "token=tok-secret-1 api_key=key-secret-2 secret=sec-secret-3",
    "Authorization: Bearer bearer-secret-4",
    "a NUL \x00 inside",
    "controls \x1b[31m red \r\x07\x08 \u2028 \u202e",
    "a lone surrogate \ud800 and \udfff",
    "backslashes \\\\ \\u0000 \\ud800 \\",
    "postgresql://shop:url-secret-5@db.internal/shop",
    '{"password": "json-secret-6"}',
]
SECRETS = [
    "hunter2",
    "tok-secret-1",
    "key-secret-2",
    "sec-secret-3",
    "bearer-secret-4",
    "url-secret-5",
    "json-secret-6",
    "field-secret-7",
]
HUGE = 300_000  # characters of the one huge line


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"down": value}
    return value


class _Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@handler("hostile.password", max_attempts=3, lease="30s")
def password(ctx: Any, payload: Any) -> None:
    """The plainest poison: a password in a line, by both ways a handler logs."""
    record(ctx)
    logging.getLogger("shop").warning("password=hunter2")
    ctx.log.info("password=hunter2")


@handler("hostile.poisoned", max_attempts=3, lease="30s")
def poisoned(ctx: Any, payload: Any) -> None:
    record(ctx)
    shop = logging.getLogger("shop")
    for text in HOSTILE_TEXTS:
        ctx.log.info(text, detail=text)
        shop.warning(text)
        shop.warning("%s", text)
    warnings.warn('a warning: "password=hunter2"', stacklevel=1)
    ctx.log.info("huge", line="x" * HUGE + "password=hunter2")
    shop.warning("y" * HUGE)
    ctx.log.info(
        "odd values",
        nan=float("nan"),
        infinity=float("-inf"),
        big=10**5000,
        nested=_nested(5000),
        unprintable=_Unprintable(),
        mapping={("tuple", "key"): 1, 2: "two", "db_password": "field-secret-7"},
        raw=b"\x00\xff",
    )
    shop.warning(
        "extra fields",
        extra={"detail": HOSTILE_TEXTS, "nested": _nested(5000), "unprintable": _Unprintable()},
    )
    shop.warning("%d items, and db_password=%s", "not a number", "field-secret-7")
    try:
        raise ValueError("password=hunter2 \x00 \ud800")
    except ValueError:
        ctx.log.exception("it failed", password="hunter2")
        shop.exception('caught "password=hunter2"')


@handler("hostile.plain", max_attempts=3, lease="30s")
def plain(ctx: Any, payload: Any) -> None:
    record(ctx)
    ctx.log.info("plain work done", n=payload.get("n", 0))
