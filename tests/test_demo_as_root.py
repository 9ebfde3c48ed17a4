"""The demo as root: its throwaway server, run as the account nobody, cannot be turned
against root by a process of that account, gets nothing of root's environment, and goes
away with its directory when the demo is stopped by a signal.

Each demo runs as a real `jobrunner demo` process with a temporary directory of its own
(TMPDIR, sticky and open to all like /tmp), so that a test finds its own demo's directory
and no other run's.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cronjob import embedded
from tests import pgserver
from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the demo's throwaway server is for root")

HOLD = "tests.handlers.demo_hold"
DEMO_TIMEOUT = 120  # seconds: only bounds a hung demo


@pytest.fixture
def nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(embedded.THROWAWAY_ACCOUNT)
    except KeyError:
        pytest.skip("this system has no account nobody")


@pytest.fixture
def demo_tmp() -> Iterator[Path]:
    """The demo's TMPDIR: root's, sticky and open to all, as /tmp is."""
    tmp = Path(tempfile.mkdtemp(prefix="jr-demo-tmp-", dir="/tmp"))
    tmp.chmod(0o1777)
    try:
        yield tmp
    finally:
        _stop_servers_under(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def _env(tmp: Path, **more: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(Path.home()),
        "TMPDIR": str(tmp),
        "PYTHONPATH": str(ROOT),
        **more,
    }


def _demo(tmp: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cronjob", "demo", *args],
        env=_env(tmp, **env),
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _held_demo(tmp: Path, **env: str) -> tuple[subprocess.Popen[str], Path]:
    """A demo held in its greeting while its server runs, and the demo's directory."""
    held = tmp / "held"
    demo = _demo(tmp, "--handlers", HOLD, JOBRUNNER_TEST_DEMO_HELD=str(held), **env)

    def holding() -> bool:
        if demo.poll() is not None:
            raise AssertionError(f"the demo ended (exit {demo.returncode}): {demo.stderr.read()}")
        return held.exists()

    wait_for(holding, "the demo's greeting to run", timeout=DEMO_TIMEOUT)
    [home] = tmp.glob("jobrunner-demo-*")
    return demo, home


def _release(tmp: Path) -> None:
    (tmp / "held.released").touch()


def _server_processes(under: Path) -> dict[int, int]:
    """The live processes working in a directory under `under` (a PostgreSQL server's
    processes work in its data directory), and the account each runs as."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            owner = (entry / "status").stat().st_uid
        except OSError:
            continue  # gone, or a zombie
        if cwd.startswith(f"{under}/"):
            found[int(entry.name)] = owner
    return found


def _parent(pid: int) -> int:
    # The field after the command's name, which is in parentheses and may hold spaces.
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def _stop_servers_under(tmp: Path) -> None:
    """Whatever server a failed demo left running under `tmp`: asked to quit, then killed."""
    for sig in (signal.SIGQUIT, signal.SIGKILL):
        for pid in _server_processes(tmp):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not _server_processes(tmp), "the servers to go", timeout=10)
            return


def test_the_servers_processes_get_none_of_roots_environment(demo_tmp, nobody):
    token = secrets.token_hex(8)
    roots = {
        "AWS_SECRET_ACCESS_KEY": f"aws-secret-{token}",
        "PGPASSWORD": f"pg-password-{token}",
        "APP_DATABASE_URL": f"postgresql://app:db-password-{token}@db.internal/app",
    }
    demo, home = _held_demo(demo_tmp, **roots)
    try:
        processes = _server_processes(home)
        assert processes and set(processes.values()) == {nobody.pw_uid}
        environs = {pid: Path(f"/proc/{pid}/environ").read_bytes() for pid in processes}
        # The postmaster's is as it was given (its children write their titles over theirs).
        [postmaster] = [pid for pid in processes if _parent(pid) not in processes]
        assert b"PATH=" in environs[postmaster]
        leaked = [
            (pid, name)
            for pid, environ in environs.items()
            for name, value in roots.items()
            if name.encode() in environ or value.encode() in environ
        ]
        assert leaked == []
        _release(demo_tmp)
        _, stderr = demo.communicate(timeout=DEMO_TIMEOUT)
        assert demo.returncode == 0, stderr
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_demo_its_server_and_removes_its_directory(demo_tmp, sig, code):
    demo, home = _held_demo(demo_tmp)
    try:
        assert _server_processes(home)
        demo.send_signal(sig)
        _, stderr = demo.communicate(timeout=DEMO_TIMEOUT)
        assert demo.returncode == code, stderr
        said = [x for x in stderr.splitlines() if x.strip() and not x.startswith("{")]
        assert said == [
            f"jobrunner: the demo was stopped ({sig.name}): its throwaway server is stopped "
            "and removed"
        ]
        wait_for(lambda: not _server_processes(home), "the server's processes to end")
        assert list(demo_tmp.glob("jobrunner-demo-*")) == []
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()


# How many demos the attacker races. Against a demo that handed the whole tree to the
# account and then chowned it by name, it won ten single demos out of ten (measured);
# three make a miss most unlikely, at a few seconds a demo.
RACED_DEMOS = 3


def _victim(under: Path) -> Path:
    """A tree of root's mirroring the names of the server binaries' installation, with
    empty files, that the account may look at and not change."""
    package = embedded._binaries().parent.parent
    victim = under / "victim"
    for source in (package, package.parent / f"{package.name}.libs"):
        for directory, _, files in os.walk(source):
            mirror = victim / Path(directory).relative_to(package.parent)
            mirror.mkdir(parents=True)
            for name in files:
                (mirror / name).touch()
    for path in (victim, *victim.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return victim


def _standard_python(user: pwd.struct_passwd) -> pgserver.AccountPython:
    """A Python `user` can run: one for the standard library alone is enough, and costs no
    copy when this process's or the system's is within its reach."""
    for candidate in (sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin")):
        if candidate is None:
            continue
        with contextlib.suppress(OSError):
            probe = subprocess.run(
                [candidate, "-c", "pass"],
                cwd="/",
                capture_output=True,
                check=False,
                **pgserver.as_account(user),
            )
            if probe.returncode == 0:
                return pgserver.AccountPython(candidate)
    return pgserver.runnable_python(user)


def _owners(tree: Path) -> set[int]:
    return {os.lstat(path).st_uid for path in tree.rglob("*")}


def test_a_process_of_the_account_racing_the_demo_cannot_get_root_to_chown_files(demo_tmp, nobody):
    victim = _victim(demo_tmp)
    python = _standard_python(nobody)
    stop = demo_tmp / "stop-attacking"
    source = (Path(__file__).parent / "symlink_attacker.py").read_text()
    attacker = subprocess.Popen(
        [python.executable, "-c", source, str(demo_tmp), str(victim), str(stop)],
        env={"PATH": "/usr/bin:/bin", **python.env},
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **pgserver.as_account(nobody),
    )
    try:
        results = []
        for _ in range(RACED_DEMOS):
            demo = _demo(demo_tmp)
            results.append((demo.communicate(timeout=DEMO_TIMEOUT)[1], demo.returncode))
        stop.touch()
        seen, errors = attacker.communicate(timeout=30)
        assert attacker.returncode == 0, errors
    finally:
        if attacker.poll() is None:
            attacker.kill()
        pgserver.remove_python(python)
    assert int(seen) == RACED_DEMOS  # it saw every demo
    assert _owners(victim) == {0}
    assert [code for _, code in results] == [0] * RACED_DEMOS, results


def test_roots_connections_reach_only_a_server_run_as_the_account(nobody, tmp_path):
    """A process of the account that links the server's socket to another one (a server
    the account could not reach, of another user's) cannot lead root's connections there."""
    import socket
    import threading
    from urllib.parse import parse_qs, urlsplit

    import psycopg

    elsewhere = tmp_path / "socket"  # in a directory of root's alone
    received: list[bytes] = []
    with socket.socket(socket.AF_UNIX) as listener, embedded.throwaway_server() as url:
        listener.bind(str(elsewhere))
        listener.listen()
        listener.settimeout(DEMO_TIMEOUT)

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(TimeoutError):
                    received.append(conn.recv(1024))

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        [socket_dir] = parse_qs(urlsplit(url).query)["host"]
        [server_socket] = Path(socket_dir).glob(".s.PGSQL.*[0-9]")
        subprocess.run(
            ["ln", "-sfn", str(elsewhere), str(server_socket)],
            check=True,
            cwd="/",
            **pgserver.as_account(nobody),
        )
        with pytest.raises(psycopg.OperationalError, match="requirepeer"):
            psycopg.connect(url, connect_timeout=10)
        server.join(timeout=DEMO_TIMEOUT)
    assert received in ([], [b""])  # nothing sent, not even the user name
