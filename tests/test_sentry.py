"""Sentry: a handler's exception is reported once per attempt, with the run's fields, to a
real endpoint (a small HTTP server here that reads the SDK's envelopes), before the tick
exits."""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.conftest import jobrunner_process
from tests.factories import insert_run

pytest.importorskip("sentry_sdk", reason="the sentry extra is part of the test extra")


@pytest.fixture
def sentry() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A DSN, and the events its endpoint received."""
    events: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            encoding = self.headers.get("Content-Encoding")
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "br":  # the SDK's choice when brotli is installed
                import brotli

                body = brotli.decompress(body)
            lines = body.split(b"\n")
            # An envelope: its header, then each item's header and payload, a line each.
            for header, payload in zip(lines[1::2], lines[2::2], strict=False):
                if json.loads(header).get("type") == "event":
                    events.append(json.loads(payload))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://public@127.0.0.1:{server.server_address[1]}/42", events
    finally:
        server.shutdown()
        server.server_close()


def tick(db_url: str, dsn: str) -> None:
    env = {"SENTRY_DSN": dsn, "SENTRY_ENVIRONMENT": "test"}
    process = jobrunner_process(
        "tick", "--database-url", db_url, "--handlers", "tests.handlers.observed", env=env
    )
    _out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err


def test_a_handlers_exception_is_reported_once_with_the_run(db_url, conn, sentry):
    dsn, events = sentry
    run_id = insert_run(conn, "test.traced_failure")
    insert_run(conn, "test.traced")  # succeeds: nothing to report

    tick(db_url, dsn)

    [event] = events  # sent before the tick exited
    [exception] = event["exception"]["values"]
    assert (exception["type"], exception["value"]) == ("ValueError", "the bank said no")
    assert event["tags"]["jobrunner.job_type"] == "test.traced_failure"
    assert event["tags"]["jobrunner.run_id"] == str(run_id)
    assert event["contexts"]["jobrunner run"]["attempt"] == 1
    assert event["contexts"]["jobrunner run"]["final_attempt"] is True
    assert event["environment"] == "test"


def test_a_retry_is_not_reported(db_url, conn, sentry):
    dsn, events = sentry
    insert_run(conn, "test.retry_soon")
    tick(db_url, dsn)
    assert events == []
    assert conn.execute("SELECT status FROM job_runs").fetchone()[0] == "failed"


LEAKY_PAYLOAD = {
    "card": "4111111111111111",
    "bearer": "bear-9-secret",
    "password": "hunter2-secret",
    "token": "tok-7-secret",
}


def _assert_no_secret(event: dict[str, Any]) -> None:
    text = json.dumps(event)
    for secret in LEAKY_PAYLOAD.values():
        assert secret not in text, secret
    frames = event["exception"]["values"][0]["stacktrace"]["frames"]
    assert frames and not any("vars" in frame for frame in frames)
    assert "postgresql://shop:***@db.internal/shop with token=***" in text


def test_a_report_holds_no_secret_the_stored_error_does_not(db_url, conn, sentry):
    dsn, events = sentry
    insert_run(conn, "test.leaky_failure", payload=LEAKY_PAYLOAD)
    tick(db_url, dsn)
    [event] = events
    _assert_no_secret(event)


def test_a_report_holds_no_secret_when_the_app_initialized_the_sdk_itself(db_url, conn, sentry):
    dsn, events = sentry
    insert_run(conn, "test.leaky_failure", payload=LEAKY_PAYLOAD)
    process = jobrunner_process(
        "tick",
        "--database-url",
        db_url,
        "--handlers",
        "tests.handlers.sentry_app",
        env={"SHOP_SENTRY_DSN": dsn},
    )
    _out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    [event] = events
    _assert_no_secret(event)


def test_before_send_is_there_for_apps_to_pass_to_the_sdk():
    from cronjob.sentry import before_send

    event = {
        "exception": {"values": [{"value": "token=abc", "stacktrace": {"frames": [
            {"function": "charge", "vars": {"card": "4111111111111111"}}
        ]}}]},
        "request": {"headers": {"Authorization": "Basic dXNlcjpwdw==", "Accept": "*/*"}},
        "extra": {"db_password": "pw", "attempts": 3},
    }  # fmt: skip
    assert before_send(event, {}) == {
        "exception": {"values": [{"value": "token=***", "stacktrace": {"frames": [
            {"function": "charge"}
        ]}}]},
        "request": {"headers": {"Authorization": "***", "Accept": "*/*"}},
        "extra": {"db_password": "***", "attempts": 3},
    }  # fmt: skip
