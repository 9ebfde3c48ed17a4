"""Check-in pings: a real local HTTP server receives what a schedule's runs report."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import tests.handlers.basic  # noqa: F401 - registers the test handlers
from tests.conftest import count, jobrunner_process, run_cli
from tests.factories import tick


class Monitor:
    """A stand-in for Healthchecks: counts the paths requested of it. A path in `redirects`
    is answered with a redirect there; one in `failing` with a 500 whose reason phrase
    repeats what was requested, as a careless server's error page would."""

    def __init__(self) -> None:
        self.paths: Counter[str] = Counter()
        self.redirects: dict[str, str] = {}
        self.failing: set[str] = set()
        monitor = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                monitor.paths[self.path] += 1
                path = self.path.split("?")[0]
                if path in monitor.redirects:
                    self.send_response(302)
                    self.send_header("Location", monitor.redirects[path])
                elif path in monitor.failing:
                    self.send_response(500, self.path)
                else:
                    self.send_response(200)
                self.end_headers()
                self.wfile.write(b"OK")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _serve() -> Iterator[Monitor]:
    found = Monitor()
    yield found
    found.server.shutdown()
    found.server.server_close()


monitor = pytest.fixture(_serve)
elsewhere = pytest.fixture(_serve)  # a second server, on another port


def add(db_url: str, name: str, job_type: str, *args: str) -> None:
    result = run_cli(
        "schedule",
        "add",
        name,
        "--cron",
        "* * * * *",
        "--type",
        job_type,
        "--catch-up",
        "all",
        "--database-url",
        db_url,
        *args,
    )
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
    add(
        db_url,
        "custom",
        "test.give_up",
        "--ping-url",
        f"{monitor.url}/c",
        "--ping-failure-url",
        f"{monitor.url}/c?state=fail",
    )
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
        "schedule",
        "add",
        "bad-url",
        "--cron",
        "@daily",
        "--type",
        "t",
        "--ping-url",
        url,
        "--database-url",
        db_url,
    )
    assert result.exit_code == 2
    assert "invalid ping_url" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert count(conn, "SELECT count(*) FROM job_definitions") == 0


def tick_process(db_url: str) -> str:
    """A real `jobrunner tick`, one handler thread, so runs finish in claim order; its stderr."""
    tick = jobrunner_process(
        "tick",
        "--database-url",
        db_url,
        "--handlers",
        "tests.handlers.basic",
        "--types",
        "test.ok",
        "--concurrency",
        "1",
    )
    _, err = tick.communicate(timeout=60)
    assert tick.returncode == 0, err
    return err


def json_lines(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines()]


def test_a_ping_url_written_badly_by_sql_is_skipped_once_and_the_other_pings_still_go(
    db_url, conn, monitor
):
    # The bad schedule's runs go first (a lower priority number), so its pings come first.
    add(db_url, "careless", "test.ok", "--priority", "-1", "--ping-url", f"{monitor.url}/x")
    add(db_url, "good", "test.ok", "--ping-url", f"{monitor.url}/good")
    conn.execute(
        "UPDATE job_definitions SET ping_url = 'hc-ping.example/uuid-of-careless'"
        " WHERE name = 'careless'"
    )
    three_minutes_due(conn)

    err = tick_process(db_url)

    assert monitor.paths == {"/good": 3}
    lines = json_lines(err)  # every line JSON: no traceback
    skipped = [line for line in lines if line["event"] == "check-in ping skipped"]
    assert len(skipped) == 1
    assert skipped[0]["schedule"] == "careless"
    assert "http" in skipped[0]["why"]
    assert "uuid-of-careless" not in err


def test_a_redirect_to_another_host_or_port_is_not_followed(db_url, conn, monitor, elsewhere):
    monitor.redirects["/hop"] = f"{elsewhere.url}/landed"
    add(db_url, "bounced", "test.ok", "--ping-url", f"{monitor.url}/hop")
    three_minutes_due(conn)

    err = tick_process(db_url)

    assert monitor.paths == {"/hop": 3}
    assert elsewhere.paths == {}
    failed = [line for line in json_lines(err) if line["event"] == "check-in ping failed"]
    assert len(failed) == 3 and all("redirect" in line["error"] for line in failed)


def test_no_secret_path_or_query_of_a_ping_url_reaches_the_log(db_url, conn, monitor, elsewhere):
    monitor.failing.add("/echoed-path-secret")
    monitor.redirects["/redirected-path-secret"] = f"{elsewhere.url}/landed"
    targets = {
        "echoed": f"{monitor.url}/echoed-path-secret?key=echoed-query-secret",
        "redirected": f"{monitor.url}/redirected-path-secret?key=redirected-query-secret",
        "refused": "http://127.0.0.1:9/refused-path-secret?key=refused-query-secret",
        "careless": f"{monitor.url}/careless-path-secret",
    }
    for name, url in targets.items():
        add(db_url, name, "test.ok", "--ping-url", url)
    conn.execute(
        "UPDATE job_definitions SET ping_url = 'ftp://127.0.0.1/careless-path-secret"
        "?key=careless-query-secret' WHERE name = 'careless'"
    )
    three_minutes_due(conn)

    err = tick_process(db_url)

    assert monitor.paths["/echoed-path-secret?key=echoed-query-secret"] == 3
    assert "secret" not in err
    events = [line["event"] for line in json_lines(err)]
    assert events.count("check-in ping failed") == 9
    assert events.count("check-in ping skipped") == 1
    assert "127.0.0.1" in err
