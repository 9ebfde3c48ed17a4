"""The handler bench/latency.py's ticks run: it notes when each run started.

Appends "<k> <start time>" (Unix time, as time.time()) to the file LATENCY_LOG names, one
write per run, so the harness can set each run's start beside its enqueue's commit.
"""

from __future__ import annotations

import os
import time
from typing import Any

from cronjob import handler

_LOG = os.open(os.environ["LATENCY_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


@handler("latency.probe")
def probe(ctx: Any, payload: Any) -> None:
    started = time.time()
    os.write(_LOG, f"{payload['k']} {started:.6f}\n".encode())


@handler("latency.other")
def other(ctx: Any, payload: Any) -> None:
    """A type bench/notify.py's "a tick of other types" handles: none of its runs."""
