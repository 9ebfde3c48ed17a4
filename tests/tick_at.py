"""`python -m tests.tick_at URL NOW [TICK OPTIONS AS JSON]`: one real tick process whose clock
is pinned to NOW (ISO 8601), for tests that drive time through the database clock.

Runs the library's tick with the test handlers of tests.handlers.overlap and prints its
summary as JSON. Options: `lease` (seconds), `tenants_sql`, `types` (default: overlap.slow;
the handlers of tests.handlers.batches may be named too).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime

import tests.handlers.batches
import tests.handlers.overlap  # noqa: F401 - registers overlap.slow
from tests.factories import tick


def main() -> None:
    url, now = sys.argv[1], datetime.fromisoformat(sys.argv[2])
    extra = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    types = extra.pop("types", ["overlap.slow"])
    report = tick(url, *types, now=now, **extra)
    print(json.dumps(report.summary()))


if __name__ == "__main__":
    main()
