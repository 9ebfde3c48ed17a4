"""jobrunner: scheduled and deferred background jobs on PostgreSQL, woken by cron."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cronjob.handlers import Backoff, Fail, Retry, handler

if TYPE_CHECKING:
    from cronjob.api import (
        enqueue,
        enqueue_async,
        enqueue_batch,
        enqueue_batch_async,
        enqueue_many,
        new_run,
    )
    from cronjob.waiting import wait, wait_async

__all__ = [
    "Backoff",
    "Fail",
    "Retry",
    "enqueue",
    "enqueue_async",
    "enqueue_batch",
    "enqueue_batch_async",
    "enqueue_many",
    "handler",
    "new_run",
    "wait",
    "wait_async",
]


def __getattr__(name: str) -> Any:
    # enqueue pulls in the database layer; handler modules that only declare
    # handlers should not pay for it at import.
    if name in (
        "enqueue",
        "enqueue_async",
        "enqueue_batch",
        "enqueue_batch_async",
        "enqueue_many",
        "new_run",
    ):
        from cronjob import api

        return getattr(api, name)
    if name in ("wait", "wait_async"):
        from cronjob import waiting

        return getattr(waiting, name)
    raise AttributeError(f"module 'cronjob' has no attribute {name!r}")
