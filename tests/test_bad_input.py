"""Bad input: one clear line naming the problem, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest

from tests.conftest import count, run_cli

DEEP = "[" * 100 + "]" * 100
HUGE = json.dumps({"blob": "x" * 1_100_000})

CASES = {
    "invalid JSON": (["enqueue", "t", "--payload", "{nope"], "invalid JSON"),
    "JSON too deep": (["enqueue", "t", "--payload", DEEP], "nested deeper"),
    "JSON far too deep": (["enqueue", "t", "--payload", "[" * 100_000], "nested"),
    "payload too large": (["enqueue", "t", "--payload", HUGE], "too large"),
    "NUL in payload": (["enqueue", "t", "--payload", '{"a": "x\\u0000y"}'], "NUL"),
    "NaN in payload": (["enqueue", "t", "--payload", '{"a": NaN}'], "NaN"),
    "bad duration": (["enqueue", "t", "--delay", "5 parsecs"], "invalid --delay"),
    "negative duration": (["enqueue", "t", "--delay", "-5m"], "invalid --delay"),
    "bad run-at": (["enqueue", "t", "--run-at", "next tuesday"], "ISO-8601"),
    "run-at and delay": (["enqueue", "t", "--run-at", "2030-01-01", "--delay", "1m"], "either"),
    "zero max attempts": (["enqueue", "t", "--max-attempts", "0"], "invalid --max-attempts"),
    "word priority": (["enqueue", "t", "--priority", "high"], "priority"),
    "empty type": (["enqueue", ""], "TYPE"),
    "NUL in type": (["enqueue", "a\x00b"], "NUL"),
    "payload and file": (["enqueue", "t", "--payload", "{}", "--payload-file", "-"], "either"),
    "jsonl not an object": (["enqueue", "--jsonl", "-"], "line 1"),
    "bad id for show": (["show", "abc"], "invalid run id"),
    "zero id": (["retry", "0"], "invalid run id"),
    "unknown option": (["retry", "-5"], "No such option"),
    "missing id": (["show"], "Missing argument"),
    "out of range concurrency": (["tick", "--concurrency", "0"], "--concurrency"),
    "huge id": (["cancel", str(2**70)], "invalid run id"),
    "bad status filter": (["list", "--status", "exploded"], "unknown status"),
    "bad tick duration": (["tick", "--max-runtime", "forever"], "max runtime"),
}


@pytest.mark.parametrize("args, message", CASES.values(), ids=CASES.keys())
def test_bad_input_is_one_line_exit_2_and_writes_nothing(db_url, conn, args, message):
    stdin = "[1, 2]\n" if "--jsonl" in args else ""
    result = run_cli(*args, "--database-url", db_url, input=stdin)
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert message in lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


@pytest.mark.parametrize(
    "payload, problem",
    [
        ({"a": "x\x00y"}, "NUL"),
        ({"\x00": 1}, "NUL"),
        ({"a": "\ud800"}, "surrogate"),
        ({"a": float("nan")}, "not valid JSON"),
        ({"a": {1, 2}}, "set"),
        (json.loads("[" * 65 + "]" * 65), "nested deeper"),
        ({"blob": "é" * 600_000}, "too large"),
    ],
)
def test_the_python_api_refuses_what_jsonb_cannot_store(conn, payload, problem):
    from cronjob.api import enqueue
    from cronjob.errors import BadInput

    with pytest.raises(BadInput, match=problem):
        enqueue(conn, "t", payload)
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_text_that_only_looks_like_an_escaped_nul_is_accepted(conn):
    from cronjob.api import enqueue

    run_id = enqueue(conn, "t", {"a": "\\u0000", "brackets": "[[[[{{{{" * 20})
    stored = conn.execute("SELECT payload FROM job_runs WHERE id = %s", [run_id]).fetchone()[0]
    assert stored == {"a": "\\u0000", "brackets": "[[[[{{{{" * 20}


SAME_MISTAKE = {
    "unknown status": (
        "exploded",
        [[c, "--status", "exploded"] for c in ("list", "retry", "cancel", "prune")],
    ),
    "bad run id": ("abc", [[c, "abc"] for c in ("show", "retry", "cancel", "prune")]),
}


@pytest.mark.parametrize("value, commands", SAME_MISTAKE.values(), ids=SAME_MISTAKE.keys())
def test_every_command_refuses_the_same_mistake_in_the_same_words(db_url, conn, value, commands):
    results = [run_cli(*args, "--database-url", db_url) for args in commands]
    assert [r.exit_code for r in results] == [2] * len(commands), [r.stderr for r in results]
    [line] = {r.stderr.strip() for r in results}
    assert "\n" not in line and repr(value) in line
    assert count(conn, "SELECT count(*) FROM job_runs") == 0
