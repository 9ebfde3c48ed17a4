"""The dashboard served for real in the test process: uvicorn on a loopback port of its own,
in a thread, and plain HTTP requests to it (what a browser or curl would send)."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """`app` on http://127.0.0.1:PORT until the block ends; yields that base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the dashboard did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: str


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def request(
    url: str,
    *,
    method: str = "GET",
    form: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """One HTTP request, redirects not followed; any status is an answer, not an error."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    sent = dict(headers or {})
    if data is not None:
        sent.setdefault("Content-Type", "application/x-www-form-urlencoded")
    req = urllib.request.Request(url, data=data, method=method, headers=sent)
    opener = urllib.request.build_opener(_NoRedirects)
    try:
        with opener.open(req, timeout=30) as response:
            status, got, body = response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        status, got, body = exc.code, exc.headers, exc.read()
    return Answer(status, {k.lower(): v for k, v in got.items()}, body.decode())
