"""Procrastinate side of the benchmark (runs inside bench/.envs/procrastinate).

`procrastinate --app procrastinate_app.app worker ...` runs the no-op task;
`python procrastinate_app.py enqueue N` defers N jobs with batch_defer. The
database URL comes from BENCH_DATABASE_URL.
"""

from __future__ import annotations

import asyncio
import os
import sys

import procrastinate

CHUNK = 5000

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ["BENCH_DATABASE_URL"])
)


@app.task(name="noop")
async def noop() -> None:
    return None


async def enqueue(n: int) -> None:
    async with app.open_async():
        for start in range(0, n, CHUNK):
            k = min(CHUNK, n - start)
            await noop.batch_defer_async(*({} for _ in range(k)))


if __name__ == "__main__" and sys.argv[1:2] == ["enqueue"]:
    asyncio.run(enqueue(int(sys.argv[2])))
