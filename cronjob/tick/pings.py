"""Check-in pings: a schedule's URL called once its run's outcome is committed.

The Healthchecks / Cronitor / Sentry Crons convention: a request to the schedule's
`ping_url` when a run succeeded, to its failure URL when it is dead (retries in between
call nothing). The tally hands over each committed outcome; a sender thread of its own does
the HTTP, so the drain never waits on a monitoring service. At most one ping per run, with a
short timeout; a ping that fails is logged and changes nothing about the run. At the end of
the tick the sender gets a bounded time to finish; what is still queued then is dropped, and
said so.

The stored URL is anyone's text who can write a definition row, so it is treated as hostile:
- checked again before each request by the rule `schedule add` applies
  (`cronjob.inputs.ping_url_problem`); one that breaks it is skipped, logged once a tick
  as `check-in ping skipped` with the schedule and why;
- redirects are not followed: monitoring services answer the ping itself, and a redirect
  could send the request on to an address inside the network;
- the log names the URL's host only, never its path or query (usually the secret token),
  and an error's message has every other part of the URL taken out;
- whatever a ping raises is caught there, so one bad ping never stops the others.

A tick whose schedules have no ping URL builds no pinger at all.
"""

from __future__ import annotations

import queue
import re
import threading
from typing import Any

from cronjob.models import ClaimedRun, PingTarget, Status

PING_TIMEOUT = 5.0  # seconds for one request
CLOSE_BOUND = 10.0  # seconds the end of a tick waits for pings still queued
ERROR_CHARS = 300  # what an error's message is clipped to in the log

_Ping = tuple[PingTarget, int, str, str]  # target, run id, which URL ("ping_url"...), url


class Pinger:
    """Queues pings for committed outcomes; one daemon thread sends them in order."""

    def __init__(self, targets: dict[int, PingTarget], log: Any) -> None:
        self.targets = targets
        self.log = log
        self._queue: queue.SimpleQueue[_Ping | None] = queue.SimpleQueue()
        self._sender: threading.Thread | None = None
        # Owned by the sender thread: each URL's verdict, and the skips already logged.
        self._problems: dict[str, str | None] = {}
        self._skips_logged: set[tuple[int, str]] = set()
        self._opener: Any = None

    def committed(self, run: ClaimedRun, status: Status) -> None:
        """`run`'s outcome is in the database: ping if it is final and its schedule pings."""
        target = self.targets.get(run.definition_id)  # type: ignore[arg-type]
        if target is None or status not in (Status.SUCCEEDED, Status.DEAD):
            return
        if status is Status.SUCCEEDED:
            which, url = "ping_url", target.ping_url
        else:
            which, url = "ping_failure_url", target.ping_failure_url
        if self._sender is None:
            self._sender = threading.Thread(
                target=self._send_all, name="jobrunner-pings", daemon=True
            )
            self._sender.start()
        self._queue.put((target, run.id, which, url))

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
            try:
                self._send(*ping)
            except BaseException:
                # Only the log line of a ping can fail here: the next ping must still go.
                continue

    def _send(self, target: PingTarget, run_id: int, which: str, url: str) -> None:
        if url not in self._problems:
            from cronjob.inputs import ping_url_problem

            self._problems[url] = ping_url_problem(url)
        problem = self._problems[url]
        if problem is not None:
            if (target.definition_id, which) not in self._skips_logged:
                self._skips_logged.add((target.definition_id, which))
                self.log.warning(
                    "check-in ping skipped",
                    schedule=target.name,
                    run_id=run_id,
                    field=which,
                    why=problem,
                )
            return
        try:
            self._request(url)
        except BaseException as exc:  # a ping never stops the tick, nor the pings after it
            self._failed(target, run_id, url, exc)

    def _request(self, url: str) -> None:
        from urllib.request import Request

        if self._opener is None:
            self._opener = _opener_without_redirects()
        request = Request(url, headers={"User-Agent": "jobrunner"})
        with self._opener.open(request, timeout=PING_TIMEOUT) as response:
            response.read(4096)

    def _failed(self, target: PingTarget, run_id: int, url: str, exc: BaseException) -> None:
        from urllib.error import HTTPError
        from urllib.parse import urlsplit

        if isinstance(exc, HTTPError) and 300 <= exc.code < 400:
            error = f"HTTP {exc.code}: redirects are not followed"
        else:
            error = f"{type(exc).__name__}: {_without_url(str(exc), url)}"
        self.log.warning(
            "check-in ping failed",
            schedule=target.name,
            run_id=run_id,
            host=urlsplit(url).hostname,
            error=error,
        )


def _opener_without_redirects() -> Any:
    """urllib's opener, but a 3xx answer is an error (HTTPError), never a second request."""
    # Imported here, by the sender thread: the drain never waits for urllib to load.
    import urllib.request

    class NoRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    return urllib.request.build_opener(NoRedirects)


# Where a URL's pieces are cut apart to be taken out of a message one by one.
_URL_SEPARATORS = re.compile(r"[/?&=#;@:,]")
# Shorter pieces would blot out ordinary words; the longer runs they belong to go whole.
_SHORTEST_PIECE = 4


def _without_url(message: str, url: str) -> str:
    """`message` on one line without any part of `url` but its scheme, host and port, and
    without database passwords: an exception's message may quote the URL it was given."""
    from urllib.parse import unquote, urlsplit

    from cronjob.text import one_line, redact

    # Only so much is shown, but a piece of the URL that starts there must be taken whole.
    message = message[: ERROR_CHARS * 4 + len(url)]
    parts = urlsplit(url)
    shown = {parts.scheme, parts.hostname, str(parts.port)}
    after_scheme = url.split("://", 1)[-1]
    pieces = {url, after_scheme, parts.netloc, parts.path, parts.query, parts.fragment}
    pieces.update(_URL_SEPARATORS.split(after_scheme))
    spellings = {s for p in pieces for s in (p, unquote(p), repr(p)[1:-1])}
    for piece in sorted(spellings - shown, key=len, reverse=True):
        if len(piece) >= _SHORTEST_PIECE:
            message = message.replace(piece, "…")
    return redact(one_line(message, limit=ERROR_CHARS))
