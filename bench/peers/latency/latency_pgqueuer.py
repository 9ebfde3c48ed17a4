"""bench/latency.py's PgQueuer side (runs in bench/.envs/pgqueuer): the worker's app
(`pgq run latency_pgqueuer:main`) and the enqueuer's client."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries

DSN = os.environ["BENCH_DATABASE_URL"]


@contextlib.asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    connection = await asyncpg.connect(DSN)
    pgq = PgQueuer(AsyncpgDriver(connection))
    log = os.open(os.environ["LATENCY_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @pgq.entrypoint("latency")
    async def latency(job: Job) -> None:
        started = time.time()
        k = json.loads(job.payload or b"{}")["k"]
        os.write(log, f"{k} {started:.6f}\n".encode())

    try:
        yield pgq
    finally:
        await connection.close()


async def connect() -> Any:
    return Queries(AsyncpgDriver(await asyncpg.connect(DSN)))


async def close(client: Any) -> None:
    await client.driver._connection.close()


async def enqueue(client: Any, k: int, run_at: datetime | None) -> None:
    # PgQueuer takes a delay, added to the server's now() as the job goes in.
    after = timedelta(0) if run_at is None else run_at - datetime.now(UTC)
    await client.enqueue("latency", json.dumps({"k": k}).encode(), 0, after)


async def enqueue_batch(client: Any, ks: list[int]) -> None:
    payloads = [json.dumps({"k": k}).encode() for k in ks]
    await client.enqueue(["latency"] * len(ks), payloads, [0] * len(ks))
