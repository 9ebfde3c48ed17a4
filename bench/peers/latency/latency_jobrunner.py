"""bench/latency.py's jobrunner client (runs in the harness's own venv): enqueue_async for
one run a transaction, enqueue_many for a burst."""

from __future__ import annotations

import asyncio
import os
from datetime import datetime
from typing import Any

import psycopg

from cronjob import enqueue_async, enqueue_many, new_run


async def connect() -> Any:
    return await psycopg.AsyncConnection.connect(os.environ["BENCH_DATABASE_URL"], autocommit=True)


async def close(client: Any) -> None:
    await client.close()


async def enqueue(client: Any, k: int, run_at: datetime | None) -> None:
    await enqueue_async(client, "latency.probe", {"k": k}, run_at=run_at)


def _burst(ks: list[int]) -> None:
    with psycopg.connect(os.environ["BENCH_DATABASE_URL"]) as conn:
        enqueue_many(conn, (new_run("latency.probe", {"k": k}) for k in ks))


async def enqueue_batch(_client: Any, ks: list[int]) -> None:
    await asyncio.to_thread(_burst, ks)
