"""One raw-SQL worker: claim a batch, mark it succeeded, until nothing is left.

Run as `python -m bench.suite.ceiling_client URL LIMIT WORKER` from the
repository root. Only psycopg is imported, so its start-up cost is close to
the floor.
"""

from __future__ import annotations

import sys

import psycopg

from bench.suite.statements import CLAIM, FINISH


def drain(url: str, limit: int, worker: str) -> int:
    done = 0
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            rows = conn.execute(
                CLAIM, {"types": ["noop"], "limit": limit, "worker": worker}
            ).fetchall()
            if not rows:
                return done
            conn.execute(FINISH, {"ids": [r[0] for r in rows], "tokens": [r[1] for r in rows]})
            done += len(rows)


if __name__ == "__main__":
    url, limit, worker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    print(drain(url, limit, worker))
