"""`python -m tests.tick_at URL NOW [TICK OPTIONS AS JSON]`: one real tick process whose clock
is pinned to NOW (ISO 8601), for tests that drive time through the database clock.

Runs the library's tick with the test handlers of tests.handlers.overlap and prints its
summary as JSON. Options: `lease` (seconds), `tenants_sql`.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime

import tests.handlers.overlap  # noqa: F401 - registers overlap.slow
from cronjob.db import Database, connect
from cronjob.handlers import registry
from cronjob.tick import TickOptions, run_tick


def main() -> None:
    url, now = sys.argv[1], datetime.fromisoformat(sys.argv[2])
    extra = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    conn = connect(url)
    try:
        report = run_tick(
            conn,
            {"overlap.slow": registry()["overlap.slow"]},
            database=Database(url),
            options=TickOptions(now=now, owns_process=False, **extra),
        )
    finally:
        conn.close()
    print(json.dumps(report.summary()))


if __name__ == "__main__":
    main()
