"""PgQueuer side of the benchmark (runs inside bench/.envs/pgqueuer).

`pgq run pgqueuer_app:main` starts a worker with one no-op entrypoint;
`python pgqueuer_app.py enqueue N` defers N jobs through PgQueuer's own
batch enqueue. The database URL comes from BENCH_DATABASE_URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries

DSN = os.environ["BENCH_DATABASE_URL"]
CHUNK = 5000


@contextlib.asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    connection = await asyncpg.connect(DSN)
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        return None

    try:
        yield pgq
    finally:
        await connection.close()


async def enqueue(n: int) -> None:
    connection = await asyncpg.connect(DSN)
    try:
        queries = Queries(AsyncpgDriver(connection))
        for start in range(0, n, CHUNK):
            k = min(CHUNK, n - start)
            await queries.enqueue(["noop"] * k, [None] * k, [0] * k)
    finally:
        await connection.close()


if __name__ == "__main__" and sys.argv[1:2] == ["enqueue"]:
    asyncio.run(enqueue(int(sys.argv[2])))
