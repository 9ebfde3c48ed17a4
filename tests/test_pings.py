"""Check-in pings: a real local HTTP server receives what a schedule's runs report."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import tests.handlers.basic  # noqa: F401 - registers the test handlers
from tests.conftest import count, run_cli
from tests.factories import tick


class Monitor:
    """A stand-in for Healthchecks: counts the paths requested of it."""

    def __init__(self) -> None:
        self.paths: Counter[str] = Counter()
        monitor = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                monitor.paths[self.path] += 1
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"OK")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def monitor() -> Iterator[Monitor]:
    found = Monitor()
    yield found
    found.server.shutdown()
    found.server.server_close()


def add(db_url: str, name: str, job_type: str, *args: str) -> None:
    result = run_cli(
        "schedule", "add", name, "--cron", "* * * * *", "--type", job_type,
        "--catch-up", "all", "--database-url", db_url, *args,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr


def three_minutes_due(conn) -> None:
    conn.execute(
        "UPDATE job_definitions SET materialized_through = date_trunc('minute', now())"
        " - interval '3 minutes' + interval '1 second',"
        " next_fire_at = date_trunc('minute', now()) - interval '2 minutes'"
    )


def test_each_succeeded_run_pings_once_and_each_dead_run_pings_its_failure_url(
    db_url, conn, monitor
):
    add(db_url, "good", "test.ok", "--ping-url", f"{monitor.url}/good")
    add(db_url, "bad", "test.give_up", "--ping-url", f"{monitor.url}/bad")
    add(db_url, "custom", "test.give_up", "--ping-url", f"{monitor.url}/c",
        "--ping-failure-url", f"{monitor.url}/c?state=fail")  # fmt: skip
    three_minutes_due(conn)

    report = tick(db_url, "test.ok", "test.give_up")

    assert (report.succeeded, report.dead) == (3, 6)
    assert monitor.paths == {"/good": 3, "/bad/fail": 3, "/c?state=fail": 3}


def test_a_retried_run_pings_only_for_its_final_outcome(db_url, conn, monitor):
    add(db_url, "flaky", "test.fail", "--ping-url", f"{monitor.url}/flaky")
    three_minutes_due(conn)

    tick(db_url, "test.fail")  # first attempts: failed, will retry
    assert monitor.paths == {}
    assert run_cli("schedule", "pause", "flaky", "--database-url", db_url).exit_code == 0
    while count(conn, "SELECT count(*) FROM job_runs WHERE status = 'failed'"):
        retry_at = conn.execute("SELECT max(run_at) FROM job_runs").fetchone()[0]
        tick(db_url, "test.fail", now=retry_at)

    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'dead'") == 3
    assert monitor.paths == {"/flaky/fail": 3}


def test_a_schedule_without_a_ping_url_pings_nothing(db_url, conn, monitor):
    add(db_url, "quiet", "test.ok")
    three_minutes_due(conn)
    assert tick(db_url, "test.ok").succeeded == 3
    assert monitor.paths == {}


def test_an_unreachable_ping_url_changes_no_outcome_and_is_logged(db_url, conn, capsys):
    # Port 9 (discard) on the loopback: nothing listens, the connection is refused at once.
    add(db_url, "unheard", "test.ok", "--ping-url", "http://127.0.0.1:9/ping")
    three_minutes_due(conn)

    report = tick(db_url, "test.ok")

    assert report.succeeded == 3
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'succeeded'") == 3
    logged = capsys.readouterr().err
    assert logged.count("check-in ping failed") == 3
    assert "/ping" not in logged.split("check-in ping failed")[1].split("\n")[0]


@pytest.mark.parametrize(
    "url", ["ftp://example.com/x", "not a url", "http://", "https://exa mple.com/", "x" * 3000]
)
def test_a_bad_ping_url_is_one_line_exit_2(db_url, conn, url):
    result = run_cli(
        "schedule", "add", "bad-url", "--cron", "@daily", "--type", "t", "--ping-url", url,
        "--database-url", db_url,
    )  # fmt: skip
    assert result.exit_code == 2
    assert "invalid ping_url" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0
