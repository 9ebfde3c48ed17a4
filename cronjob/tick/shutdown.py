"""Shutdown: why the tick stops claiming, and how long running handlers may still take.

A stop has one reason, the first one given: `max-runtime`, `database error`, or the
name of the signal (SIGTERM, SIGINT). From then on nothing more is claimed, runs no
worker has started go back at once, and running handlers get `--grace` to finish
before their runs are handed back too. A second signal makes the stop urgent: the
grace period ends there and then. So does a database that refuses the tick's
statements, since nothing a handler returns could be recorded.

A signal also calls each of `wakers`: a listening tick asleep in `select` wakes at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any


class Shutdown:
    """The stop request of one tick; set by the loop, by a signal, or by a database error."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.reason: str | None = None
        self.urgent = False
        self.at = 0.0
        self.signum: int | None = None  # the signal that asked for the stop, if one did
        # Called on a signal, from the handler (the main thread): cheap, and never raising.
        self.wakers: list[Callable[[], None]] = []

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str, *, now: float | None = None, urgent: bool = False) -> None:
        """Stop for `reason`, unless a stop is under way already (the first reason stays);
        `urgent`: with no grace period, whenever the stop began."""
        if self.reason is None:
            self.reason = reason
            self.at = time.monotonic() if now is None else now
        if urgent:
            self.urgent = True

    def grace_spent(self, now: float) -> bool:
        return self.urgent or (self.reason is not None and now - self.at >= self.grace)

    def on_signal(self, signum: int, _frame: Any = None) -> None:
        if self.reason is None:
            self.request(signal.Signals(signum).name)
            self.signum = signum
        else:
            self.urgent = True
        for wake in self.wakers:
            wake()

    @contextlib.contextmanager
    def signals_handled(self, enabled: bool = True) -> Iterator[None]:
        """SIGTERM and SIGINT request a stop while the block runs; the old handlers come back after.

        Only the main thread may install signal handlers: elsewhere (a tick run by a
        test or an app thread) the block runs with the signals left as they are.
        """
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        for sig in previous:
            signal.signal(sig, self.on_signal)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
