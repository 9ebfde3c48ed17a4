"""The demo's greeting, made to hold the demo while its server runs, for tests that watch
that server or stop the demo mid-way.

The greeting creates the file named by JOBRUNNER_TEST_DEMO_HELD, then waits until a file
of the same name with the suffix `.released` exists.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import cronjob.demo  # noqa: F401  the demo's handlers first, so that this greeting replaces theirs
from cronjob import handler


@handler("demo.greet", max_attempts=1)
def greet_and_hold(ctx: Any, payload: Any) -> None:
    held = Path(os.environ["JOBRUNNER_TEST_DEMO_HELD"])
    held.touch()
    released = held.with_name(held.name + ".released")
    while not released.exists():
        time.sleep(0.01)
