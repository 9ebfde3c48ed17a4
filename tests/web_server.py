"""The dashboard served for real: in the test process (uvicorn on a loopback port of its own,
in a thread), or as `jobrunner web` in a process of its own; and plain HTTP requests to it
(what a browser or curl would send)."""

from __future__ import annotations

import http.client
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
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
    cookies: list[str] = field(default_factory=list)  # every Set-Cookie, as sent


def request(
    url: str,
    *,
    method: str = "GET",
    form: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    source: str | None = None,
) -> Answer:
    """One HTTP request, redirects not followed; any status is an answer, not an error.
    Headers are sent as given (a `Host` of another name too), from the loopback address
    `source` when given."""
    parts = urllib.parse.urlsplit(url)
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    sent = dict(headers or {})
    if data is not None:
        sent.setdefault("Content-Type", "application/x-www-form-urlencoded")
    connection = http.client.HTTPConnection(
        parts.hostname,
        parts.port,
        timeout=30,
        source_address=(source, 0) if source else None,
    )
    try:
        target = parts.path or "/"
        connection.request(method, target + (f"?{parts.query}" if parts.query else ""), data, sent)
        response = connection.getresponse()
        body = response.read()
        got = {k.lower(): v for k, v in response.getheaders()}
        cookies = response.headers.get_all("set-cookie") or []
        return Answer(response.status, got, body.decode(), cookies)
    finally:
        connection.close()


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class WebProcess:
    """A `jobrunner web` process: where it answers, what it printed, and its login link."""

    process: subprocess.Popen[str]
    base: str
    port: int
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)

    @property
    def login_link(self) -> str | None:
        """The link with the login token, as printed on stdout."""
        for line in self.stdout:
            if "?token=" in line:
                return line.strip()
        return None

    def login(self) -> str:
        """A session cookie from the login link, as a browser that opened it holds it."""
        link = self.login_link
        assert link is not None, self.stdout
        answer = request(link)
        assert answer.status == 303, answer
        return cookie_pair(answer, "jobrunner_session")


def cookie_pair(answer: Answer, name: str) -> str:
    """`name=value` of the cookie `answer` sets, for a Cookie header."""
    for cookie in answer.cookies:
        if cookie.startswith(f"{name}="):
            return cookie.split(";")[0]
    raise AssertionError(f"no {name} cookie in {answer.cookies}")


def form_token(answer: Answer) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', answer.body).group(1)


@contextmanager
def jobrunner_web(db_url: str, *args: str, env: dict[str, str] | None = None) -> Iterator[Any]:
    """`jobrunner web --database-url DB_URL --port PORT ARGS` as a process of its own, until
    the block ends (SIGTERM); yields a WebProcess once it answers."""
    from tests.conftest import jobrunner_process, wait_for

    port = free_port()
    process = jobrunner_process(
        "web", "--database-url", db_url, "--port", str(port), *args, env=env
    )
    web = WebProcess(process, f"http://127.0.0.1:{port}", port)
    readers = [
        threading.Thread(target=_read_lines, args=(stream, lines), daemon=True)
        for stream, lines in ((process.stdout, web.stdout), (process.stderr, web.stderr))
    ]
    for reader in readers:
        reader.start()
    try:
        wait_for(lambda: process.poll() is not None or _answers(web.base), "jobrunner web")
        assert process.poll() is None, "".join(web.stderr)
        yield web
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        for reader in readers:
            reader.join(timeout=30)


def _read_lines(stream: Any, lines: list[str]) -> None:
    for line in stream:
        lines.append(line)


def _answers(base: str) -> bool:
    """Whether it listens: any answer will do (basic authentication's 401 too)."""
    try:
        request(base + "/healthz")
    except OSError:
        return False
    return True
