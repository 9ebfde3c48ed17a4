"""Log lines: JSON on stderr when it is not a terminal, whoever renders them."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def _log_lines(code: str) -> tuple[list[dict], str]:
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
    (light, structlogs, after), stdout = _log_lines(code)
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
    (warning, error), _ = _log_lines(code)
    assert (warning["level"], warning["worker"], error["level"]) == ("warning", "w", "error")
