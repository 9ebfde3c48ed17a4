"""Check-in pings: a schedule's URL called once its run's outcome is committed.

The Healthchecks / Cronitor / Sentry Crons convention: a request to the schedule's
`ping_url` when a run succeeded, to its failure URL when it is dead (retries in between
call nothing). The tally hands over each committed outcome; a sender thread of its own does
the HTTP, so the drain never waits on a monitoring service. At most one ping per run, with a
short timeout; a ping that fails is logged (with the URL's host only: the rest of such URLs
is usually the secret) and changes nothing about the run. At the end of the tick the sender
gets a bounded time to finish; what is still queued then is dropped, and said so.

A tick whose schedules have no ping URL builds no pinger at all.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from cronjob.models import ClaimedRun, PingTarget, Status

PING_TIMEOUT = 5.0  # seconds for one request
CLOSE_BOUND = 10.0  # seconds the end of a tick waits for pings still queued

_Ping = tuple[PingTarget, int, str]  # target, run id, url


class Pinger:
    """Queues pings for committed outcomes; one daemon thread sends them in order."""

    def __init__(self, targets: dict[int, PingTarget], log: Any) -> None:
        self.targets = targets
        self.log = log
        self._queue: queue.SimpleQueue[_Ping | None] = queue.SimpleQueue()
        self._sender: threading.Thread | None = None

    def committed(self, run: ClaimedRun, status: Status) -> None:
        """`run`'s outcome is in the database: ping if it is final and its schedule pings."""
        target = self.targets.get(run.definition_id)  # type: ignore[arg-type]
        if target is None or status not in (Status.SUCCEEDED, Status.DEAD):
            return
        url = target.ping_url if status is Status.SUCCEEDED else target.ping_failure_url
        if self._sender is None:
            self._sender = threading.Thread(
                target=self._send_all, name="jobrunner-pings", daemon=True
            )
            self._sender.start()
        self._queue.put((target, run.id, url))

    def close(self, bound: float = CLOSE_BOUND) -> None:
        """Let queued pings go out, waiting at most `bound` seconds."""
        if self._sender is None:
            return
        self._queue.put(None)
        self._sender.join(bound)
        if self._sender.is_alive():
            self.log.warning(
                "check-in pings dropped: the tick ended before they could be sent",
                pending=self._queue.qsize(),
            )

    def _send_all(self) -> None:
        while (ping := self._queue.get()) is not None:
            self._send(*ping)

    def _send(self, target: PingTarget, run_id: int, url: str) -> None:
        import urllib.request
        from urllib.parse import urlsplit

        request = urllib.request.Request(url, headers={"User-Agent": "jobrunner"})
        try:
            with urllib.request.urlopen(request, timeout=PING_TIMEOUT) as response:
                response.read(4096)
        except Exception as exc:
            self.log.warning(
                "check-in ping failed",
                schedule=target.name,
                run_id=run_id,
                host=urlsplit(url).hostname,
                error=f"{type(exc).__name__}: {exc}"[:300],
            )
