"""Log lines: JSON on stderr when it is not a terminal, whoever renders them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cronjob import log
from tests.conftest import ROOT
from tests.factories import insert_run, insert_runs


@pytest.fixture(autouse=True)
def _restore_logging():
    yield
    log.configure("info")


def _lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_batched_lines_match_the_loggers_own(capsys):
    log.configure(json=True)
    logger = log.get_logger(worker="host:1")
    record = {"job_type": "t", "run_id": 7, "attempt": 1, "duration_ms": 0.5, "outcome": "ok"}
    logger.info("run finished", **record)
    log.log_many(logger, "info", "run finished", [record, {**record, "run_id": 8}])
    own, first, second = _lines(capsys.readouterr().err)
    assert list(first) == list(own)  # same keys in the same order
    assert {k: v for k, v in first.items() if k != "timestamp"} == {
        k: v for k, v in own.items() if k != "timestamp"
    }
    assert first["timestamp"].endswith("Z") and second["run_id"] == 8


def test_batched_lines_respect_the_level(capsys):
    log.configure("warning", json=True)
    logger = log.get_logger()
    log.log_many(logger, "info", "run finished", [{"run_id": 1}])
    log.log_many(logger, "warning", "run finished", [{"run_id": 2}])
    assert [e["run_id"] for e in _lines(capsys.readouterr().err)] == [2]


def test_console_output_goes_through_the_logger(capsys):
    log.configure(json=False)
    log.log_many(log.get_logger(), "info", "run finished", [{"run_id": 1}, {"run_id": 2}])
    err = capsys.readouterr().err
    assert err.count("run finished") == 2 and "run_id" in err


def test_batched_lines_encode_any_value_as_the_logger_does(capsys):
    log.configure(json=True)
    logger = log.get_logger(worker="host:1")
    record = {
        "text": 'quote " backslash \\ newline \n é \u2028 \x00',
        "big": 2**70,
        "neg": -3,
        "flag": True,
        "none": None,
        "ratio": 0.1,
        "nan": float("nan"),
        "items": [1, "a"],
        "obj": object(),
        "worker": "override",
    }
    logger.info("e", **record)
    log.log_many(logger, "info", "e", [record, {k: v for k, v in record.items() if k != "worker"}])
    # Split on "\n" only: U+2028 is written as is, and splitlines() would cut there.
    own, batched, plain = capsys.readouterr().err.rstrip("\n").split("\n")
    without_time = [line.rsplit(', "timestamp"', 1)[0] for line in (own, batched, plain)]
    assert without_time[1] == without_time[0]  # a record that overrides the context
    assert without_time[2] == without_time[0].replace('"override"', '"host:1"', 1)


def _logged_by_a_process(code: str) -> tuple[list[dict], str]:
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stderr.splitlines()], result.stdout


def test_a_command_event_logged_before_structlog_is_set_up_reads_as_structlog_writes_it():
    code = (
        "import sys\n"
        "from cronjob import log\n"
        "log.info('tick finished', claimed=0, name='caf\\u00e9', ids=[1, 2], odd=object)\n"
        "print('structlog' in sys.modules)\n"
        "log.get_logger().info('tick finished', claimed=0, name='caf\\u00e9', ids=[1, 2],"
        " odd=object)\n"
        "log.info('after', claimed=1)\n"
    )
    (light, structlogs, after), stdout = _logged_by_a_process(code)
    assert stdout == "False\n"
    assert light.pop("timestamp").endswith("Z")
    assert structlogs.pop("timestamp").endswith("Z")
    assert list(light.items()) == list(structlogs.items())
    assert light == {
        "claimed": 0,
        "name": "café",
        "ids": [1, 2],
        "odd": "<class 'object'>",
        "event": "tick finished",
        "level": "info",
    }
    assert after["event"] == "after"


def test_warnings_and_errors_carry_their_level():
    code = (
        "from cronjob import log\n"
        "log.get_logger(worker='w').warning('tick stopped')\n"
        "log.get_logger().error('pruning failed', error='x')\n"
    )
    (warning, error), _ = _logged_by_a_process(code)
    assert (warning["level"], warning["worker"], error["level"]) == ("warning", "w", "error")


def test_every_line_a_tick_writes_is_json_even_what_the_driver_and_libpq_would_say(
    db_url, conn, tmp_path
):
    # psycopg logs through the standard library (errors it ignored while cleaning up a
    # lost connection); libpq prints its own warning about a password file others can
    # read. Neither may write plain text between the JSON lines.
    from tests.conftest import jobrunner_process

    insert_run(conn, "noise.driver")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".pgpass").write_text("*:*:*:*:not-the-password\n")
    (home / ".pgpass").chmod(0o644)
    tick = jobrunner_process(
        "tick",
        "--database-url",
        db_url,
        "--handlers",
        "tests.handlers.driver_noise",
        env={"HOME": str(home), "PGPASSFILE": ""},
    )
    _, stderr = tick.communicate(timeout=60)
    assert tick.returncode == 0, stderr
    events = [json.loads(line) for line in stderr.splitlines()]  # fails on any plain line
    names = [e["event"] for e in events]
    assert "password file ignored: group or others can read it (make it mode 0600)" in names
    [driver] = [e for e in events if e.get("logger") == "psycopg"]
    assert driver["level"] == "warning" and "the connection is lost" in driver["event"]
    assert names[-1] == "tick finished"


def test_at_log_level_warning_a_tick_logs_its_failed_runs_and_nothing_else(db_url, conn):
    from tests.conftest import jobrunner_process

    insert_runs(conn, 2, "test.ok")
    insert_run(conn, "test.fail")
    tick = jobrunner_process(
        "tick",
        "--database-url",
        db_url,
        "--handlers",
        "tests.handlers.basic",
        "--log-level",
        "warning",
        "--json",
    )
    out, err = tick.communicate(timeout=60)
    assert tick.returncode == 0, err
    assert json.loads(out)["succeeded"] == 2
    [line] = [json.loads(text) for text in err.splitlines()]
    assert (line["event"], line["outcome"], line["level"]) == ("run finished", "failed", "warning")


def test_every_command_takes_the_log_level_from_the_environment(empty_database_url):
    from tests.conftest import jobrunner_process

    quiet = jobrunner_process(
        "migrate", "--database-url", empty_database_url, env={"JOBRUNNER_LOG_LEVEL": "warning"}
    )
    _, err = quiet.communicate(timeout=60)
    assert quiet.returncode == 0 and err == ""
    told = jobrunner_process("migrate", "--database-url", empty_database_url)
    _, err = told.communicate(timeout=60)
    assert told.returncode == 0 and '"event": "' in err  # info: says what it did


def test_an_unknown_log_level_is_one_line_and_exit_2():
    from tests.conftest import run_cli

    result = run_cli("status", "--log-level", "loud")
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert "--log-level" in line and "'loud'" in line


# Handler threads and the tick's own batched lines, all long: a pipe takes a write larger than
# PIPE_BUF in pieces, and sys.stderr has no lock of its own.
_INTERLEAVING = """
import threading
from cronjob import log
log.configure()
logger = log.get_logger()
def work(n):
    for _ in range(10):
        logger.info("long", line=str(n) * 200_000)
threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
for thread in threads:
    thread.start()
for n in range(40):
    log.log_many(logger, "info", "batch", [{"i": n}])
for thread in threads:
    thread.join()
"""


def test_long_lines_from_many_threads_are_never_interleaved():
    process = subprocess.run(
        [sys.executable, "-c", _INTERLEAVING],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert process.returncode == 0, process.stderr[-2000:]
    events = [json.loads(line) for line in process.stderr.rstrip("\n").split("\n")]
    assert sum(e["event"] == "long" for e in events) == 40
    assert sum(e["event"] == "batch" for e in events) == 40
