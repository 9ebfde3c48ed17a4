"""bench/latency.py's Procrastinate side (runs in bench/.envs/procrastinate): the worker's
app (`procrastinate --app latency_procrastinate.app worker`) and the enqueuer's client."""

from __future__ import annotations

import os
import time
from datetime import datetime
from typing import Any

import procrastinate

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ["BENCH_DATABASE_URL"])
)
_LOG: int | None = None


@app.task(name="latency")
async def latency(k: int) -> None:
    global _LOG
    started = time.time()
    if _LOG is None:
        _LOG = os.open(os.environ["LATENCY_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_LOG, f"{k} {started:.6f}\n".encode())


async def connect() -> Any:
    if not getattr(app, "_latency_open", False):
        await app.open_async()
        app._latency_open = True  # type: ignore[attr-defined]
    return app


async def close(_client: Any) -> None:
    if getattr(app, "_latency_open", False):
        app._latency_open = False  # type: ignore[attr-defined]
        await app.close_async()


async def enqueue(_client: Any, k: int, run_at: datetime | None) -> None:
    task = latency.configure(schedule_at=run_at) if run_at is not None else latency
    await task.defer_async(k=k)


async def enqueue_batch(_client: Any, ks: list[int]) -> None:
    await latency.batch_defer_async(*({"k": k} for k in ks))
