"""bench/latency.py's graphile-worker client (runs in the harness's own venv): its SQL
functions, graphile_worker.add_job and add_jobs, through psycopg."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

import psycopg

ADD_JOB = "SELECT graphile_worker.add_job('latency', json_build_object('k', %s), run_at => %s)"
ADD_JOBS = """
SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(
    SELECT ROW('latency', json_build_object('k', k), NULL, NULL, NULL, NULL, NULL, NULL)
           ::graphile_worker.job_spec
    FROM unnest(%s::int[]) AS k
))"""


async def connect() -> Any:
    return await psycopg.AsyncConnection.connect(os.environ["BENCH_DATABASE_URL"], autocommit=True)


async def close(client: Any) -> None:
    await client.close()


async def enqueue(client: Any, k: int, run_at: datetime | None) -> None:
    await client.execute(ADD_JOB, [k, run_at])


async def enqueue_batch(client: Any, ks: list[int]) -> None:
    await client.execute(ADD_JOBS, [ks])
