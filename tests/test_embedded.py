"""The embedded server: refused as root, reachable by its owner alone whatever the paths,
and changing the mode of no directory jobrunner did not create."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cronjob import embedded
from tests import pgserver

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def _ancestors(*paths: Path) -> list[Path]:
    found: set[Path] = {Path("/tmp"), Path(tempfile.gettempdir())}
    for path in paths:
        found.update(path.parents)
        if path.exists():
            found.add(path)
    return sorted(found)


def _modes(paths: list[Path]) -> dict[str, int]:
    return {str(p): os.lstat(p).st_mode for p in paths if os.path.lexists(p)}


def _jobrunner(*args: str, env: dict[str, str], account: Account | None = None, cwd: Path):
    """`jobrunner ARGS` as this process, or as `account` with the Python it can run."""
    python = account.python if account else pgserver.AccountPython(sys.executable)
    # This session's Python imports the jobrunner under test as the session does.
    checkout = {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}
    return subprocess.run(
        [python.executable, "-m", "cronjob", *args],
        env={**env, **(checkout if python.copy is None else {}), **python.env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        **pgserver.as_account(account.user if account else None),
    )


def _bare_env(home: Path, **more: str) -> dict[str, str]:
    # As under cron: no XDG_RUNTIME_DIR, no database URL.
    return {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), **more}


@as_root
def test_as_root_the_embedded_server_is_refused_in_one_line_and_nothing_changes(tmp_path):
    data = Path(tempfile.mkdtemp(prefix="jr-root-")) / "jobrunner"
    watched = _ancestors(data, Path.home(), embedded._binaries())
    before, users = _modes(watched), Path("/etc/passwd").read_text()
    try:
        for command in (["status"], ["list"]):
            result = _jobrunner(
                *command, env=_bare_env(Path.home(), JOBRUNNER_DATA_DIR=str(data)), cwd=tmp_path
            )
            assert result.returncode == 1, result.stderr
            [line] = result.stderr.strip().splitlines()
            assert "does not run as root" in line and "JOBRUNNER_DATABASE_URL" in line
        assert not data.exists()
        assert _modes(watched) == before
        assert Path("/etc/passwd").read_text() == users
    finally:
        shutil.rmtree(data.parent, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="the demo's throwaway server is for root")
def test_as_root_the_demo_runs_on_a_throwaway_server_and_leaves_nothing_behind(tmp_path):
    data = Path(tempfile.mkdtemp(prefix="jr-root-")) / "jobrunner"
    watched = _ancestors(data, Path.home(), embedded._binaries())
    before, users = _modes(watched), Path("/etc/passwd").read_text()
    # A TMPDIR of its own, open to all as /tmp is: what is left in it is this demo's.
    demo_tmp = Path(tempfile.mkdtemp(prefix="jr-demo-tmp-", dir="/tmp"))
    demo_tmp.chmod(0o1777)
    try:
        env = _bare_env(Path.home(), JOBRUNNER_DATA_DIR=str(data), TMPDIR=str(demo_tmp))
        result = _jobrunner("demo", env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        # Its retry is due at once: retried before the tick ends if other runs still ran.
        assert re.search(r"demo\.flaky +(failed|succeeded) ", result.stdout), result.stdout
        assert "throwaway server is gone" in result.stdout
        assert not data.exists()  # not the embedded server's data directory
        assert list(demo_tmp.iterdir()) == []
        assert _modes(watched) == before
        assert Path("/etc/passwd").read_text() == users  # no account added
    finally:
        shutil.rmtree(data.parent, ignore_errors=True)
        shutil.rmtree(demo_tmp, ignore_errors=True)


@dataclass(frozen=True)
class Account:
    """Who runs the embedded server: the tests' own account as root, else ourselves (None),
    and a Python it can run jobrunner with."""

    user: pwd.struct_passwd | None
    python: pgserver.AccountPython


@pytest.fixture(scope="session")
def account() -> Iterator[Account]:
    """The account, with this session's Python, or (when the account cannot reach it, as a
    pyenv under /root) a copy of it made once for the session and removed after."""
    user = pgserver.account() if os.geteuid() == 0 else None
    try:
        python = pgserver.runnable_python(user)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        pytest.skip(f"the unprivileged account cannot run this Python or a copy of it: {exc}")
    try:
        yield Account(user, python)
    finally:
        pgserver.remove_python(python)


@dataclass
class UserServer:
    account: Account
    home: Path
    pgdata: Path
    socket_dir: Path
    watched: list[Path]
    modes_before: dict[str, int]

    @property
    def user(self) -> pwd.struct_passwd | None:
        return self.account.user

    def env(self) -> dict[str, str]:
        return _bare_env(self.home)


def _binaries_of(account: Account) -> Path:
    """The server binaries jobrunner finds when run with the account's Python."""
    python = account.python
    code = "from cronjob import embedded; print(embedded._binaries())"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **python.env}
    found = subprocess.run(
        [python.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return Path(found.stdout.strip())


def _long_home(user: pwd.struct_passwd | None) -> Path:
    # A HOME well over 63 characters: its data directory is too long to hold a socket.
    top = Path(tempfile.mkdtemp(prefix="jr-home-", dir="/tmp"))
    home = top / ("a-home-directory-with-a-long-name-" + "x" * 40)
    home.mkdir()
    if user is not None:
        for path in (top, home):
            os.chown(path, user.pw_uid, user.pw_gid)
    return home


def _stop(server_home: Path, user: pwd.struct_passwd | None) -> None:
    pgdata = server_home / ".local" / "share" / "jobrunner" / "pgdata"
    if (pgdata / "postmaster.pid").exists():
        subprocess.run(
            [
                str(embedded._binaries() / "pg_ctl"),
                "-D",
                str(pgdata),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
            cwd="/",
            capture_output=True,
            check=False,
            **pgserver.as_account(user),
        )


@pytest.fixture(scope="module")
def user_server(account: Account) -> Iterator[UserServer]:
    """The embedded server of an unprivileged user with a long HOME, started under cron's
    environment, after another user created /tmp/runtime-<uid> first."""
    user = account.user
    uid = os.geteuid() if user is None else user.pw_uid
    home = _long_home(user)
    pgdata = home / ".local" / "share" / "jobrunner" / "pgdata"
    socket_dir = embedded.socket_dir_for(pgdata, uid)
    assert socket_dir != pgdata
    squatted = Path(f"/tmp/runtime-{uid}")
    made_squat = os.geteuid() == 0 and not squatted.exists()
    if made_squat:
        squatted.mkdir(mode=0o755)  # root's, not the user's: what broke every command
    watched = _ancestors(home, _binaries_of(account), socket_dir)
    before = _modes(watched)
    try:
        result = _jobrunner("status", env=_bare_env(home), account=account, cwd=home)
        assert result.returncode == 0, result.stderr
        yield UserServer(account, home, pgdata, socket_dir, watched, before)
    finally:
        _stop(home, user)
        shutil.rmtree(home.parent, ignore_errors=True)
        shutil.rmtree(socket_dir, ignore_errors=True)
        if made_squat:
            squatted.rmdir()


def test_a_long_data_path_puts_the_socket_in_a_private_directory(user_server):
    recorded = (user_server.pgdata / "postmaster.pid").read_text().splitlines()[4]
    assert recorded == str(user_server.socket_dir)
    info = os.lstat(user_server.socket_dir)
    owner = os.geteuid() if user_server.user is None else user_server.user.pw_uid
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == owner
    assert stat.S_IMODE(info.st_mode) == 0o700
    [socket] = user_server.socket_dir.glob(".s.PGSQL.*[0-9]")
    assert stat.S_IMODE(os.lstat(socket).st_mode) == 0o700


def test_no_directory_outside_the_data_directory_changed_mode(user_server):
    assert _modes(user_server.watched) == user_server.modes_before


def test_the_owner_reaches_the_server_from_every_command(user_server):
    result = _jobrunner(
        "list", env=user_server.env(), account=user_server.account, cwd=user_server.home
    )
    assert result.returncode == 0, result.stderr


@as_root
def test_another_local_user_cannot_connect(user_server):
    stranger = pwd.getpwnam("nobody")
    url = embedded._uri(str(user_server.socket_dir), "postgres")
    code = f"import psycopg; psycopg.connect({url!r}, connect_timeout=5)"
    python = user_server.account.python  # which any account may run
    result = subprocess.run(
        [python.executable, "-c", code],
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **python.env},
        **pgserver.as_account(stranger),
    )
    assert "No module named" not in result.stderr, result.stderr
    assert result.returncode != 0
    assert "Permission denied" in result.stderr


def test_a_socket_directory_someone_else_made_is_refused_in_one_line(user_server, tmp_path):
    user = user_server.user
    home = _long_home(user)
    try:
        pgdata = home / ".local" / "share" / "jobrunner" / "pgdata"
        uid = os.geteuid() if user is None else user.pw_uid
        taken = embedded.socket_dir_for(pgdata, uid)
        taken.mkdir(mode=0o755)  # as another user who got there first would
        if user is None:
            taken.chmod(0o755)  # ours, but open to others: not private either
        result = _jobrunner("status", env=_bare_env(home), account=user_server.account, cwd=home)
        assert result.returncode == 1
        # Beside the log's JSON events (the server starting), one line of error.
        [line] = [x for x in result.stderr.strip().splitlines() if not x.startswith("{")]
        assert f"socket directory {taken} exists and is not private" in line
        assert not (pgdata / "PG_VERSION").exists()
    finally:
        shutil.rmtree(home.parent, ignore_errors=True)
        shutil.rmtree(taken, ignore_errors=True)


@as_root
def test_as_root_the_server_commands_say_in_one_line_that_it_is_refused(tmp_path):
    data = Path(tempfile.mkdtemp(prefix="jr-root-")) / "jobrunner"
    try:
        env = _bare_env(Path.home(), JOBRUNNER_DATA_DIR=str(data))
        for command in (["status"], ["status", "--json"], ["url"], ["stop"]):
            result = _jobrunner("server", *command, env=env, cwd=tmp_path)
            assert result.returncode == 1, result.stderr
            assert result.stdout == ""
            [line] = result.stderr.strip().splitlines()
            assert "does not run as root" in line and "JOBRUNNER_DATABASE_URL" in line
        assert not data.exists()
    finally:
        shutil.rmtree(data.parent, ignore_errors=True)


def _server(*args: str, home: Path, account: Account, **env: str) -> subprocess.CompletedProcess:
    return _jobrunner("server", *args, env=_bare_env(home, **env), account=account, cwd=home)


def test_server_status_url_and_stop_tell_and_drive_the_embedded_server(account):
    user = account.user
    home = Path(tempfile.mkdtemp(prefix="jr-srv-", dir="/tmp"))
    if user is not None:
        os.chown(home, user.pw_uid, user.pw_gid)
    pgdata = home / ".local" / "share" / "jobrunner" / "pgdata"
    url = embedded._uri(str(pgdata), "postgres")
    try:
        stopped = {"running": False, "data_dir": str(pgdata), "url": None, "pid": None}
        assert json.loads(_server("status", "--json", home=home, account=account).stdout) == (
            stopped
        )
        idle = _server("stop", home=home, account=account)
        assert (idle.returncode, idle.stdout) == (
            0,
            f"the embedded server was not running (data dir {pgdata})\n",
        )

        printed = _server("url", home=home, account=account)
        assert (printed.returncode, printed.stdout) == (0, url + "\n"), printed.stderr
        # The URL reaches a migrated database from code of one's own.
        enqueued = _jobrunner(
            "enqueue",
            "app.job",
            env=_bare_env(home, JOBRUNNER_DATABASE_URL=url),
            account=account,
            cwd=home,
        )
        assert (enqueued.returncode, enqueued.stdout) == (0, "1\n"), enqueued.stderr
        pid = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
        running = {"running": True, "data_dir": str(pgdata), "url": url, "pid": pid}
        assert json.loads(_server("status", "--json", home=home, account=account).stdout) == (
            running
        )
        shown = _server("status", home=home, account=account).stdout.splitlines()
        assert shown == [
            "running:   yes",
            f"data dir:  {pgdata}",
            f"url:       {url}",
            f"pid:       {pid}",
        ]

        done = _server("stop", home=home, account=account)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"stopped the embedded server (pid {pid}, data dir {pgdata})\n"
        assert not (pgdata / "postmaster.pid").exists()
        assert json.loads(_server("status", "--json", home=home, account=account).stdout) == (
            stopped
        )
        # Its data stays: started again, the run is still there.
        again = _jobrunner("list", "--json", env=_bare_env(home), account=account, cwd=home)
        assert [run["id"] for run in json.loads(again.stdout)] == [1], again.stderr
    finally:
        _stop(home, user)
        shutil.rmtree(home, ignore_errors=True)
