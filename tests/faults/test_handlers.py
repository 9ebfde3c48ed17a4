"""Handlers that misbehave: overrun their timeout, get stuck for good, or crash in
odd ways. None of it may take the tick down or lose a run."""

from __future__ import annotations

import json
import subprocess

import pytest

import tests.handlers.faults  # noqa: F401 - registers the fault handlers in this process too
from cronjob import store
from cronjob.api import enqueue
from tests.conftest import count, jobrunner_process, run_cli, wait_for
from tests.factories import tick


def test_a_handler_past_its_timeout_fails_with_error_type_timeout_and_is_told(
    db_url, conn, exec_log, monkeypatch
):
    """Scenario: a handler runs past its 1 s timeout; the attempt fails as `timeout`, ctx.cancelled
    is set, and what the handler returns afterwards is discarded."""
    monkeypatch.setenv("JOBRUNNER_TEST_EXEC_LOG", str(exec_log.path))
    run_id = enqueue(conn, "fault.timeout", {"seconds": 30})

    report = tick(db_url, "fault.timeout")

    assert (report.failed, report.succeeded) == (1, 0)
    wait_for(lambda: exec_log.of(run_id, "cancelled"), "the handler to be told")
    run = store.run_get(conn, run_id)
    assert (run.status, run.error_type, run.attempts) == ("failed", "timeout", 1)
    assert run.last_error == "handler still running after its 1s timeout"
    assert run.run_at > run.started_at  # retried later, with backoff
    [attempt] = store.run_attempts_get(conn, run_id)
    assert attempt.error_type == "timeout"


def test_a_stuck_handler_neither_holds_the_tick_nor_takes_its_worker(
    db_url, conn, start_tick, exec_log
):
    """Scenario: with one worker, a handler stuck for 10 minutes times out; the next run still
    runs and the tick exits without waiting for the stuck thread."""
    stuck = enqueue(conn, "fault.stuck", {"seconds": 600})
    t = start_tick(db_url, "--concurrency", "1", "--grace", "2s")
    wait_for(lambda: exec_log.of(stuck), "the stuck handler to start")
    # Claimed once the stuck run is off the tick's hands, by a fresh worker.
    after = enqueue(conn, "fault.work", {"ms": 1})

    assert t.wait(timeout=30) == 0
    summary = t.summary()
    assert (summary["dead"], summary["succeeded"]) == (1, 1)
    run = store.run_get(conn, stuck)
    assert (run.status, run.error_type) == ("dead", "timeout")
    assert store.run_get(conn, after).status == "succeeded"
    assert [e.pid for e in exec_log.of(after)] == [t.pid]


ODD = {
    "recursion": ("dead", "RecursionError"),
    "memory": ("dead", "MemoryError"),
    "exit": ("dead", "SystemExit"),
    "interrupt": ("dead", "KeyboardInterrupt"),
    "base": ("dead", "tests.handlers.faults.OddBaseException"),
    "unprintable": ("dead", "tests.handlers.faults.Unprintable"),
    "nul": ("dead", "ValueError"),
    "huge-message": ("dead", "ValueError"),
    "async": ("dead", "TypeError"),
    "missing-key": ("dead", "KeyError"),
    "garbage": ("succeeded", None),  # whatever a handler returns is ignored
}


def test_handlers_crashing_in_odd_ways_never_take_the_tick_down(db_url, conn, start_tick):
    """Scenario: one worker runs handlers that recurse, exit, raise BaseException, unprintable
    or NUL-laden errors, return garbage; each is recorded and the run after them succeeds."""
    ids = {do: enqueue(conn, "fault.odd", {"do": do}) for do in ODD}
    last = enqueue(conn, "fault.work", {"ms": 1})
    t = start_tick(db_url, "--concurrency", "1")

    assert t.wait() == 0, t.stderr()[-3000:]
    for do, expected in ODD.items():
        run = store.run_get(conn, ids[do])
        assert (run.status, run.error_type) == expected, do
    assert store.run_get(conn, last).status == "succeeded"
    assert t.summary()["dead"] == len(ODD) - 1

    nul = store.run_get(conn, ids["nul"])
    assert nul.last_error == "bad\\x00byte and half a surrogate \\udcff"
    unprintable = store.run_get(conn, ids["unprintable"])
    assert unprintable.last_error == "<Unprintable whose message could not be read>"
    assert len(store.run_get(conn, ids["huge-message"]).last_error) <= 2000
    assert "async" in store.run_get(conn, ids["async"]).last_error
    history = store.run_attempts_get(conn, ids["recursion"])
    assert len(history[0].traceback) <= 8100 and "RecursionError" in history[0].traceback


def _nested(depth: int) -> list:
    root: list = []
    node = root
    for _ in range(depth):
        child: list = []
        node.append(child)
        node = child
    return root


@pytest.mark.parametrize(
    ("what", "payload"),
    [
        ("nested 100,000 deep", "[" * 100_000 + "]" * 100_000),
        ("2 MB large", '{"blob": "' + "x" * 2_000_000 + '"}'),
        ("holding a NUL", '{"name": "a\\u0000b"}'),
        ("holding an unpaired surrogate", '{"name": "\\ud800"}'),
    ],
)
def test_a_poison_payload_is_refused_at_enqueue_with_exit_2(conn, db_url, what, payload):
    """Scenario: `jobrunner enqueue` is fed a poison payload; one line, exit 2, nothing written."""
    proc = jobrunner_process(
        "enqueue",
        "fault.work",
        "--payload-file",
        "-",
        "--database-url",
        db_url,
        stdin=subprocess.PIPE,
    )
    stdout, stderr = proc.communicate(payload, timeout=30)

    assert proc.returncode == 2, what
    assert stdout == "" and len(stderr.splitlines()) == 1 and "Traceback" not in stderr
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_one_poison_line_in_a_jsonl_batch_refuses_the_whole_batch(conn, db_url):
    """Scenario: `enqueue --jsonl` with one NUL-laden line among good ones writes nothing."""
    lines = [json.dumps({"type": "fault.work", "payload": {"n": n}}) for n in range(5)]
    lines.insert(3, '{"type": "fault.work", "payload": {"n": "\\u0000"}}')
    result = run_cli("enqueue", "--jsonl", "-", "--database-url", db_url, input="\n".join(lines))
    assert result.exit_code == 2
    assert result.stderr.startswith("jobrunner: error: line 4:")
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_the_python_api_refuses_a_payload_too_deep_to_store(conn):
    """Scenario: `enqueue()` with a 10,000-deep document raises BadInput, not RecursionError."""
    from cronjob.errors import BadInput

    with pytest.raises(BadInput, match="nested deeper than 64 levels"):
        enqueue(conn, "fault.work", _nested(10_000))
    assert count(conn, "SELECT count(*) FROM job_runs") == 0
