"""The enqueue ceiling: read the same JSONL `jobrunner enqueue --jsonl -` reads and
COPY it into job_runs. Run as `python -m bench.suite.copy_client URL < runs.jsonl`."""

from __future__ import annotations

import json
import sys

import psycopg


def copy_runs(url: str) -> int:
    count = 0
    with (
        psycopg.connect(url) as conn,
        conn.cursor() as cur,
        cur.copy("COPY job_runs (job_type, payload) FROM STDIN") as copy,
    ):
        for line in sys.stdin:
            if line.strip():
                run = json.loads(line)
                copy.write_row((run["type"], json.dumps(run.get("payload", {}))))
                count += 1
    return count


if __name__ == "__main__":
    print(copy_runs(sys.argv[1]))
