"""Handlers that log as Python code usually does: the standard `logging` (named loggers,
the root logger, a library's), structlog's own loggers, `warnings.warn`; for the tests of
what reaches stderr and what a run keeps (tests/test_handler_logging.py)."""

from __future__ import annotations

import asyncio
import logging
import threading
import warnings
from typing import Any

import structlog

from cronjob import handler

logger = logging.getLogger("shop.reports")


@handler("logs.stdlib")
def stdlib(ctx: Any, payload: Any) -> None:
    """One line at each level, through a named logger, with a field given by `extra=`."""
    logger.debug("report %s: reading rows", payload.get("report", 7))
    logger.info("report %s built", payload.get("report", 7), extra={"rows": 12})
    logger.warning("report %s is late", payload.get("report", 7))


@handler("logs.root_and_warnings")
def root_and_warnings(ctx: Any, payload: Any) -> None:
    """The root logger's module functions (the first of which, left alone, installs
    Python's plain-text output), a third-party library's logger, and a Python warning."""
    logging.info("root info")
    logging.warning("root warning")
    logging.getLogger("urllib3.connectionpool").info("Starting new HTTPS connection (1)")
    warnings.warn("the old report format is going away", UserWarning, stacklevel=1)


@handler("logs.structlog")
def structlog_logger(ctx: Any, payload: Any) -> None:
    structlog.get_logger("shop").info("through structlog")


@handler("logs.stdlib_not_kept", capture_logs=False)
def stdlib_not_kept(ctx: Any, payload: Any) -> None:
    logger.info("shown, not kept")


@handler("logs.secret")
def secret(ctx: Any, payload: Any) -> None:
    logger.info(
        "connecting to %s", payload["url"], extra={"dsn": payload["url"], "order": {"id": 3}}
    )


# Two runs of each pair type meet half-way (the tick runs them at once: --concurrency and
# --async-concurrency leave room for both), so each one's lines fall between the other's.
_threads_meet = threading.Barrier(2, timeout=30)
_tasks_meet = asyncio.Barrier(2)


@handler("logs.thread_pair")
def thread_pair(ctx: Any, payload: Any) -> None:
    name = payload["name"]
    logger.info("%s before", name)
    structlog.get_logger("shop").info(f"{name} via structlog")
    _threads_meet.wait()
    logger.info("%s after", name)


@handler("logs.task_pair")
async def task_pair(ctx: Any, payload: Any) -> None:
    name = payload["name"]
    logger.info("%s before", name)
    structlog.get_logger("shop").info(f"{name} via structlog")
    await asyncio.wait_for(_tasks_meet.wait(), 30)
    logger.info("%s after", name)
