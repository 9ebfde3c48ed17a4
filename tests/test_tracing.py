"""OpenTelemetry: a run continues the trace of whoever enqueued it, and a tick exports its
spans to a real OTLP/HTTP endpoint (tests/otlp.py) before it exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import ROOT, jobrunner_process, run_cli, wait_for
from tests.factories import insert_run
from tests.otlp import Collector, Span, otlp_endpoint

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is part of the test extra")

HANDLERS = "tests.handlers.observed"
CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def collector() -> Iterator[Collector]:
    with otlp_endpoint() as endpoint:
        yield endpoint


def tick(db_url: str, collector: Collector, *args: str) -> str:
    """One traced `jobrunner tick` process; returns its stderr."""
    env = {**collector.environment(), "OTEL_SERVICE_NAME": "shop-worker"}
    process = jobrunner_process(
        "tick", "--database-url", db_url, "--handlers", HANDLERS, *args, env=env
    )
    _out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return err


def attempt_span(collector: Collector, job_type: str) -> Span:
    [span] = collector.wait_for(lambda c: c.named(f"process {job_type}"))
    return span


def test_a_web_requests_trace_contains_the_ticks_span_for_the_run_it_enqueued(db_url, collector):
    env = {
        **os.environ,
        **collector.environment(),
        "OTEL_SERVICE_NAME": "shop-web",
        "PYTHONPATH": str(ROOT),
    }
    web = subprocess.run(
        [sys.executable, "-m", "tests.otel_web_app", db_url],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert web.returncode == 0, web.stderr
    answer = json.loads(web.stdout)

    tick(db_url, collector)

    [request] = collector.wait_for(lambda c: c.named("POST /orders"))
    span = attempt_span(collector, "test.traced")
    [tick_span] = collector.named("jobrunner tick")
    assert request.service == "shop-web" and span.service == "shop-worker"
    assert span.trace_id == request.trace_id == answer["trace_id"]
    assert span.parent_span_id == request.span_id  # a child of the request that enqueued it
    assert span.links == [(tick_span.trace_id, tick_span.span_id)]
    assert span.kind == "SPAN_KIND_CONSUMER"
    assert span.attributes["messaging.system"] == "jobrunner"
    assert span.attributes["messaging.operation.type"] == "process"
    assert span.attributes["messaging.destination.name"] == "test.traced"
    assert span.attributes["messaging.message.id"] == str(answer["run_id"])
    assert span.attributes["jobrunner.attempt"] == 1
    assert span.attributes["jobrunner.outcome"] == "succeeded"
    assert span.status == "STATUS_CODE_UNSET"


def test_the_handlers_own_span_is_ctx_span_and_the_current_span(db_url, conn, collector):
    insert_run(conn, "test.traced", payload={"order": 42})
    tick(db_url, collector)
    span = attempt_span(collector, "test.traced")
    [step] = collector.wait_for(lambda c: c.named("charge card"))
    assert span.attributes["shop.order"] == 42
    assert span.attributes["shop.current_is_ctx_span"] is True
    assert (step.trace_id, step.parent_span_id) == (span.trace_id, span.span_id)


def test_traceparent_in_the_environment_of_jobrunner_enqueue_is_continued(db_url, collector):
    trace_id, parent = CALLER.split("-")[1:3]
    env = {"TRACEPARENT": CALLER, "TRACESTATE": "shop=checkout"}
    enqueued = run_cli("enqueue", "test.traced", "--database-url", db_url, env=env)
    assert enqueued.exit_code == 0, enqueued.stderr

    tick(db_url, collector)

    span = attempt_span(collector, "test.traced")
    assert (span.trace_id, span.parent_span_id) == (trace_id, parent)


def test_enqueue_records_the_active_trace_context_of_the_caller(conn):
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    from cronjob import enqueue

    context = SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("shop", "checkout")]),
    )
    with trace.use_span(NonRecordingSpan(context)):
        run_id = enqueue(conn, "test.traced")
    untraced = enqueue(conn, "test.traced")
    stored = "SELECT traceparent, tracestate FROM job_runs WHERE id = %s"
    assert conn.execute(stored, [run_id]).fetchone() == (CALLER, "shop=checkout")
    assert conn.execute(stored, [untraced]).fetchone() == (None, None)


def test_a_run_enqueued_without_a_trace_is_a_child_of_the_tick_span(db_url, conn, collector):
    insert_run(conn, "test.traced")
    tick(db_url, collector)
    span = attempt_span(collector, "test.traced")
    [tick_span] = collector.named("jobrunner tick")
    assert (span.trace_id, span.parent_span_id) == (tick_span.trace_id, tick_span.span_id)
    assert span.links == []


def test_the_ticks_own_statements_are_spans_of_the_tick(db_url, conn, collector):
    insert_run(conn, "test.traced")
    tick(db_url, collector)
    [tick_span] = collector.wait_for(lambda c: c.named("jobrunner tick"))
    statements = {s.name: s for s in collector.spans if s.parent_span_id == tick_span.span_id}
    assert {"jobrunner materialize", "jobrunner claim"} <= set(statements)
    claimed = [s for s in collector.named("jobrunner claim") if s.attributes["jobrunner.claimed"]]
    assert claimed and claimed[0].attributes["db.system.name"] == "postgresql"
    written = sum(
        s.attributes.get("jobrunner.rows", s.attributes.get("jobrunner.finalized", 0))
        for s in collector.spans
        if s.name in ("jobrunner finalize", "jobrunner claim")
    )
    assert written == 1  # the one outcome, written by a claim or a finalize of its own


def test_a_failed_attempts_span_says_why(db_url, conn, collector):
    insert_run(conn, "test.traced_failure")
    tick(db_url, collector)
    span = attempt_span(collector, "test.traced_failure")
    assert span.status == "STATUS_CODE_ERROR"
    assert span.status_message == "the bank said no"
    assert span.attributes["error.type"] == "ValueError"
    assert span.attributes["jobrunner.outcome"] == "dead"
    assert span.events == ["exception"]


def test_a_sigtermed_tick_still_exports_its_spans(db_url, conn, collector, tmp_path):
    insert_run(conn, "test.slow", payload={"seconds": 30})
    exec_log = tmp_path / "exec.log"
    env = {
        **collector.environment(),
        "OTEL_BSP_SCHEDULE_DELAY": "60000",  # only at exit
        "JOBRUNNER_TEST_EXEC_LOG": str(exec_log),
    }
    process = jobrunner_process(
        "tick", "--database-url", db_url, "--handlers", HANDLERS, "--grace", "1s", env=env
    )
    # The handler itself, not only the claim: a run claimed but not yet started when the
    # signal comes is handed back before its attempt (and its span) begins.
    wait_for(lambda: exec_log.exists() and exec_log.read_text(), "the handler to start")

    process.send_signal(signal.SIGTERM)
    _out, err = process.communicate(timeout=60)

    assert process.returncode == 0, err
    span = attempt_span(collector, "test.slow")
    assert span.attributes["jobrunner.outcome"] == "handed back"
    assert collector.named("jobrunner tick") and collector.named("jobrunner claim")


def _modules_after(code: str, env: dict[str, str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


# Runs a tick in a process where OpenTelemetry cannot be imported, as without the extra.
WITHOUT_THE_EXTRA = """
import json, sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Absent())
from cronjob.cli import main
try:
    main(["tick", "--handlers", "tests.handlers.observed"])
except SystemExit as exc:
    assert exc.code == 0, exc.code
print(json.dumps(sorted(m for m in sys.modules if m.startswith("opentelemetry"))))
"""


def test_with_the_extra_absent_an_idle_tick_imports_nothing_of_opentelemetry(db_url, collector):
    env = {**collector.environment(), "JOBRUNNER_DATABASE_URL": db_url}
    assert _modules_after(WITHOUT_THE_EXTRA, env) == []


def test_an_idle_tick_imports_nothing_of_opentelemetry_even_when_it_would_trace(db_url, collector):
    code = WITHOUT_THE_EXTRA.replace("sys.meta_path.insert(0, Absent())", "")
    env = {**collector.environment(), "JOBRUNNER_DATABASE_URL": db_url}
    assert _modules_after(code, env) == []
    assert collector.spans == []  # nothing to trace


def test_with_the_extra_absent_a_traced_tick_runs_and_says_what_is_missing(db_url, conn, collector):
    insert_run(conn, "test.chatty")
    env = {**collector.environment(), "JOBRUNNER_DATABASE_URL": db_url}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_EXTRA],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []
    [warning] = [json.loads(line) for line in done.stderr.splitlines() if "otel extra" in line]
    assert "pip install 'pg-jobrunner[otel]'" in warning["event"]
    assert conn.execute("SELECT status FROM job_runs").fetchone()[0] == "failed"  # it ran


def test_a_tick_that_does_not_trace_imports_nothing_of_opentelemetry(db_url, conn):
    insert_run(conn, "test.chatty")
    code = WITHOUT_THE_EXTRA.replace("sys.meta_path.insert(0, Absent())", "")
    env = {"JOBRUNNER_DATABASE_URL": db_url}
    assert _modules_after(code, env) == []


def test_a_failed_attempts_span_holds_no_secret_the_stored_error_does_not(db_url, conn, collector):
    secrets = {"card": "4111111111111111", "bearer": "bear-9-secret", "password": "hunter2-secret"}
    run_id = insert_run(conn, "test.leaky_failure", payload={**secrets, "token": "tok-7-secret"})
    tick(db_url, collector)
    span = attempt_span(collector, "test.leaky_failure")
    [exception] = span.event_attributes
    stored = conn.execute("SELECT last_error FROM job_runs WHERE id = %s", [run_id]).fetchone()[0]
    assert exception["exception.message"] == stored == span.status_message
    assert "postgresql://shop:***@db.internal/shop with token=***" in stored
    assert exception["exception.type"] == "ConnectionError"
    assert "raise ConnectionError(" in exception["exception.stacktrace"]
    shown = json.dumps([span.attributes, span.event_attributes, span.status_message])
    for secret in [*secrets.values(), "tok-7-secret"]:
        assert secret not in shown


def test_exception_attributes_are_there_for_apps_own_spans():
    from cronjob.tracing import exception_attributes

    try:
        raise ConnectionError("postgresql://shop:hunter2-secret@db/shop Authorization: Bearer x1")
    except ConnectionError as exc:
        attributes = exception_attributes(exc)
    assert attributes["exception.type"] == "ConnectionError"
    assert attributes["exception.message"] == (
        "postgresql://shop:***@db/shop Authorization: Bearer ***"
    )
    assert "hunter2" not in attributes["exception.stacktrace"]
    assert "Traceback" in attributes["exception.stacktrace"]
