"""A handler's logs flow as Python developers expect: whatever it logs with (the standard
`logging`, any logger's, structlog, ctx.log, warnings.warn) is a JSON line on a tick's
stderr at --log-level, carrying the run's fields, and is kept with the attempt at
--capture-level, each level apart from the other. Real `jobrunner tick` processes."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.conftest import jobrunner_process, run_cli
from tests.factories import insert_run
from tests.terminal import OnTerminal

HANDLERS = "tests.handlers.stdlib_logs"


def tick(db_url: str, *args: str, handlers: str = HANDLERS, env: dict[str, str] | None = None):
    """One `jobrunner tick` process; returns its stderr."""
    process = jobrunner_process(
        "tick", "--database-url", db_url, "--handlers", handlers, *args, env=env
    )
    _out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return err


def json_lines(err: str) -> list[dict[str, Any]]:
    """Every stderr line, each of which must be one JSON object."""
    return [json.loads(line) for line in err.splitlines()]


def written(err: str, run_id: int) -> list[tuple[str, str]]:
    """The (level, event) of the lines stderr has for `run_id`, but the tick's own."""
    return [
        (line["level"], line["event"])
        for line in json_lines(err)
        if line.get("run_id") == run_id and line["event"] != "run finished"
    ]


def kept(db_url: str, run_id: int) -> list[dict[str, Any]]:
    shown = run_cli("show", str(run_id), "--database-url", db_url, "--json")
    assert shown.exit_code == 0, shown.stderr
    return [event for log in json.loads(shown.stdout)["attempt_logs"] for event in log["events"]]


def kept_events(db_url: str, run_id: int) -> list[tuple[str, str]]:
    return [(event["level"], event["event"]) for event in kept(db_url, run_id)]


def test_a_stdlib_info_line_is_json_on_stderr_with_its_run_and_kept_at_the_defaults(db_url, conn):
    run_id = insert_run(conn, "logs.stdlib")
    err = tick(db_url)

    [line] = [line for line in json_lines(err) if line["event"] == "report 7 built"]
    assert line == {
        "run_id": run_id,
        "job_type": "logs.stdlib",
        "attempt": 1,
        "logger": "shop.reports",
        "rows": 12,
        "event": "report 7 built",
        "level": "info",
        "timestamp": line["timestamp"],
    }
    assert written(err, run_id) == [("info", "report 7 built"), ("warning", "report 7 is late")]
    [info, warning] = kept(db_url, run_id)
    assert info == {**line, "timestamp": info["timestamp"]}
    assert (warning["level"], warning["event"]) == ("warning", "report 7 is late")
    shown = run_cli("show", str(run_id), "--database-url", db_url).stdout
    assert "info     report 7 built  rows=12  logger=shop.reports" in shown


def test_on_a_terminal_a_stdlib_line_is_a_console_line_with_its_run_and_still_kept(db_url, conn):
    run_id = insert_run(conn, "logs.stdlib")
    with OnTerminal("tick", "--database-url", db_url, "--handlers", HANDLERS) as terminal:
        code, _out = terminal.finish()
        screen = re.sub(r"\x1b\[[0-9;]*m", "", terminal.screen)
    assert code == 0, screen
    [line] = [line for line in screen.splitlines() if "report 7 built" in line]
    assert "[info     ] report 7 built" in line and not line.lstrip().startswith("{")
    assert "[shop.reports]" in line and "rows=12" in line and line.endswith(f"run_id={run_id}")
    assert kept_events(db_url, run_id) == [
        ("info", "report 7 built"),
        ("warning", "report 7 is late"),
    ]


def test_at_log_level_warning_an_info_line_is_not_on_stderr_but_still_kept(db_url, conn):
    run_id = insert_run(conn, "logs.stdlib")
    err = tick(db_url, "--log-level", "warning")

    assert written(err, run_id) == [("warning", "report 7 is late")]
    assert kept_events(db_url, run_id) == [
        ("info", "report 7 built"),
        ("warning", "report 7 is late"),
    ]


def test_capture_level_warning_keeps_warnings_alone_while_stderr_shows_info(db_url, conn):
    run_id = insert_run(conn, "logs.stdlib")
    err = tick(db_url, "--capture-level", "warning")

    assert written(err, run_id) == [("info", "report 7 built"), ("warning", "report 7 is late")]
    assert kept_events(db_url, run_id) == [("warning", "report 7 is late")]


def test_capture_level_comes_from_the_environment_too(db_url, conn):
    run_id = insert_run(conn, "logs.stdlib")
    tick(db_url, env={"JOBRUNNER_CAPTURE_LEVEL": "DEBUG"})
    assert [level for level, _event in kept_events(db_url, run_id)] == ["debug", "info", "warning"]


def test_capture_level_debug_keeps_debug_lines_stderr_does_not_show(db_url, conn):
    run_id = insert_run(conn, "logs.stdlib")
    err = tick(db_url, "--capture-level", "debug")

    assert ("debug", "report 7: reading rows") not in written(err, run_id)
    assert kept_events(db_url, run_id)[0] == ("debug", "report 7: reading rows")


def test_log_level_debug_shows_debug_lines_the_run_does_not_keep(db_url, conn):
    run_id = insert_run(conn, "logs.stdlib")
    err = tick(db_url, "--log-level", "debug")

    assert written(err, run_id)[0] == ("debug", "report 7: reading rows")
    assert [level for level, _event in kept_events(db_url, run_id)] == ["info", "warning"]


def test_the_root_logger_a_librarys_logger_and_python_warnings_are_json_and_kept(db_url, conn):
    run_id = insert_run(conn, "logs.root_and_warnings")
    err = tick(db_url)

    lines = json_lines(err)  # no plain-text line among them
    expected = [
        ("info", "root info"),
        ("warning", "root warning"),
        ("info", "Starting new HTTPS connection (1)"),
    ]
    assert written(err, run_id)[:3] == expected
    [warning] = [line for line in lines if line.get("logger") == "py.warnings"]
    assert warning["run_id"] == run_id and warning["level"] == "warning"
    assert "UserWarning: the old report format is going away" in warning["event"]
    events = kept(db_url, run_id)
    assert [(e["level"], e["event"]) for e in events[:3]] == expected
    loggers = ["root", "root", "urllib3.connectionpool", "py.warnings"]
    assert [event["logger"] for event in events] == loggers
    assert events[3]["level"] == "warning" and "going away" in events[3]["event"]


def test_a_structlog_logger_of_the_handlers_own_carries_the_run_like_ctx_log(db_url, conn):
    run_id = insert_run(conn, "logs.structlog")
    err = tick(db_url)
    [line] = [line for line in json_lines(err) if line["event"] == "through structlog"]
    assert (line["run_id"], line["job_type"], line["attempt"]) == (run_id, "logs.structlog", 1)
    assert kept_events(db_url, run_id) == [("info", "through structlog")]


def test_a_type_that_keeps_no_logs_still_shows_its_stdlib_lines_with_the_run(db_url, conn):
    run_id = insert_run(conn, "logs.stdlib_not_kept")
    err = tick(db_url)
    assert written(err, run_id) == [("info", "shown, not kept")]
    assert kept(db_url, run_id) == []


def test_a_stdlib_lines_arguments_and_extra_fields_are_redacted_on_stderr_and_kept(db_url, conn):
    url = "postgresql://shop:hunter2-secret@db.internal/shop"
    run_id = insert_run(conn, "logs.secret", payload={"url": url})
    err = tick(db_url)

    [line] = [line for line in json_lines(err) if line.get("run_id") == run_id][:1]
    assert line["event"] == "connecting to postgresql://shop:***@db.internal/shop"
    assert line["dsn"] == "postgresql://shop:***@db.internal/shop"
    assert line["order"] == {"id": 3}
    assert "hunter2" not in err
    [event] = kept(db_url, run_id)
    assert (event["event"], event["dsn"]) == (line["event"], line["dsn"])


def test_concurrent_handler_threads_each_keep_only_their_own_lines(db_url, conn):
    runs = {name: insert_run(conn, "logs.thread_pair", payload={"name": name}) for name in "ab"}
    err = tick(db_url, "--concurrency", "2")
    _each_has_its_own_lines(db_url, err, runs)


def test_concurrent_async_handlers_each_keep_only_their_own_lines(db_url, conn):
    runs = {name: insert_run(conn, "logs.task_pair", payload={"name": name}) for name in "ab"}
    err = tick(db_url, "--async-concurrency", "2")
    _each_has_its_own_lines(db_url, err, runs)


def _each_has_its_own_lines(db_url: str, err: str, runs: dict[str, int]) -> None:
    # Both handlers logged "before" ahead of either's "after": their lines were interleaved.
    order = [line["event"] for line in json_lines(err)]
    assert max(order.index("a before"), order.index("b before")) < min(
        order.index("a after"), order.index("b after")
    )
    for name, run_id in runs.items():
        own = [("info", f"{name} before"), ("info", f"{name} via structlog")]
        own.append(("info", f"{name} after"))
        assert written(err, run_id) == own
        assert kept_events(db_url, run_id) == own


def test_an_apps_own_logging_setup_is_left_as_it_is_and_its_records_still_kept(db_url, conn):
    run_id = insert_run(conn, "logs.own_setup")
    err = tick(db_url, handlers="tests.handlers.own_logging")
    assert "APP INFO in the app's own format" in err.splitlines()
    assert kept_events(db_url, run_id) == [("info", "in the app's own format")]


def test_a_bad_capture_level_is_one_line_and_exit_2_with_nothing_run(db_url, conn):
    run_id = insert_run(conn, "logs.stdlib")
    for args, env in [(["--capture-level", "loud"], None), ([], {"JOBRUNNER_CAPTURE_LEVEL": "x"})]:
        result = run_cli("tick", "--database-url", db_url, "--handlers", HANDLERS, *args, env=env)
        assert result.exit_code == 2
        [line] = result.stderr.splitlines()
        assert line.startswith("jobrunner tick: error: Invalid value for '--capture-level'")
    status = conn.execute("SELECT status FROM job_runs WHERE id = %s", [run_id]).fetchone()
    assert status == ("queued",)
