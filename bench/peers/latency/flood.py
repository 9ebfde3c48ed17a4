"""bench/notify.py's enqueuer: one process, one connection, one run a transaction
(`cronjob.enqueue` in autocommit) for <seconds> from the Unix time <start>; prints its count.

    python flood.py <url> <job type> <start> <seconds>
"""

from __future__ import annotations

import sys
import time

import psycopg

from cronjob import enqueue


def main() -> None:
    url, job_type, start, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    with psycopg.connect(url, autocommit=True) as conn:
        enqueue(conn, job_type)  # warm: the first statement plans and loads what it needs
        time.sleep(max(0.0, start - time.time()))
        end, count = start + seconds, 0
        while time.time() < end:
            enqueue(conn, job_type)
            count += 1
    print(count)


if __name__ == "__main__":
    main()
