"""The tests' own account (tests/pgserver.py): made as root when a session needs it, and
removed by the last session to leave it, once no process of it runs. Each test here uses an
account of its own, never the one the suite's server runs as."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests import pgserver
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root makes accounts")

# A test session, as far as the account goes: it joins, says so, and leaves when told.
SESSION = """
import sys
from tests import pgserver
pgserver.account(sys.argv[1])
print("joined", flush=True)
sys.stdin.readline()
pgserver.leave_accounts()
"""


class Session:
    """A process that uses the account as a test session does, until `leave`."""

    def __init__(self, name: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", SESSION, name],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline() == "joined\n"

    def leave(self) -> None:
        self.process.communicate("\n", timeout=30)
        assert self.process.returncode == 0


def exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture
def probe() -> Iterator[str]:
    name = f"jobrunner-probe-{os.getpid()}"
    yield name
    subprocess.run(["userdel", name], capture_output=True, check=False)
    (pgserver.ACCOUNT_LOCKS / f"{name}.lock").unlink(missing_ok=True)


def test_the_last_session_to_leave_removes_the_account_the_tests_made(probe):
    first, second = Session(probe), Session(probe)
    assert exists(probe)

    first.leave()
    assert exists(probe)  # the second still uses it

    second.leave()
    assert not exists(probe)


def test_an_account_a_process_still_runs_as_is_kept_until_a_later_session_leaves(probe):
    session = Session(probe)
    sleeper = subprocess.Popen(["sleep", "600"], **pgserver.as_account(pwd.getpwnam(probe)))
    try:
        session.leave()
        assert exists(probe)
    finally:
        sleeper.kill()
        sleeper.wait()

    Session(probe).leave()
    assert not exists(probe)


def test_an_account_the_tests_did_not_make_is_kept(probe):
    made = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", probe]
    subprocess.run(made, check=True, capture_output=True)

    Session(probe).leave()
    assert exists(probe)
