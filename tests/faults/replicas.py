"""A primary and its streaming standby on this machine, each a private server of its own,
reached through one multi-host URL that only ever connects to the one taking writes."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import wait_for
from tests.faults.conftest import PrivateServer, _private_server_binaries


class ReplicaPair:
    """`primary` streams to `standby`; `url` names both, `target_session_attrs=read-write`."""

    def __init__(self, primary: PrivateServer, standby: PrivateServer) -> None:
        self.primary = primary
        self.standby = standby
        self.url = (
            f"postgresql://postgres@/jobrunner?host={primary.root},{standby.root}"
            "&target_session_attrs=read-write"
        )

    def wait_until_the_standby_has_replayed_everything(self) -> None:
        with psycopg.connect(self.primary.url, autocommit=True) as primary:
            (written,) = primary.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        with psycopg.connect(self.standby.url, autocommit=True) as standby:

            def replayed() -> bool:
                return standby.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (written,)
                ).fetchone()[0]

            wait_for(replayed, "the standby to replay the primary's last change")

    def fence_the_primary(self) -> None:
        """What an HA tool does to a primary it gives up: it turns read-only, sessions stay."""
        with psycopg.connect(self.primary.admin_url, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            admin.execute("SELECT pg_reload_conf()")
        with psycopg.connect(self.primary.url, autocommit=True) as probe:
            # Reloaded once a session sees it: every other session was signalled with it and
            # reads it before running its next statement.
            wait_for(
                lambda: probe.execute("SHOW default_transaction_read_only").fetchone()[0] == "on",
                "the primary to turn read-only",
            )


def _server(bin_dir: Path, user: str | None) -> PrivateServer:
    root = Path(tempfile.mkdtemp(prefix="jr-pg-", dir="/tmp"))
    if user is not None:
        shutil.chown(root, user=user, group=user)
    return PrivateServer(root, bin_dir, user)


@contextlib.contextmanager
def migrated_cluster() -> Iterator[PrivateServer]:
    """A cluster initialized and migrated once (database `jobrunner`), stopped: each pair's
    primary starts from a copy of it, which is quicker than initdb on a busy machine."""
    from cronjob import migrate

    server = _server(*_private_server_binaries())
    try:
        try:
            server.init()
            with psycopg.connect(server.url, autocommit=True) as conn:
                migrate.apply(conn)
            server.stop_cleanly()
        except (subprocess.SubprocessError, OSError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            pytest.skip(f"cannot start a private server: {exc} {detail.decode()[-300:]}")
        yield server
    finally:
        server.destroy()


@contextlib.contextmanager
def server_copy(template: PrivateServer, *settings: str) -> Iterator[PrivateServer]:
    """A server started from a copy of `template`, with `settings`."""
    server = _server(template.bin_dir, template.user)
    try:
        try:
            server.copy_from(template)
            server.start(*settings)
        except (subprocess.SubprocessError, OSError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            pytest.skip(f"cannot start a private server: {exc} {detail.decode()[-300:]}")
        yield server
    finally:
        _remove(server)


@contextlib.contextmanager
def replica_pair(
    template: PrivateServer,
    *,
    settings: tuple[str, ...] = (),
    standby_settings: tuple[str, ...] = (),
    slot: str | None = None,
) -> Iterator[ReplicaPair]:
    """A primary copied from `template` and a standby streaming from it, both running with
    `settings`, the standby with `standby_settings` too and, given a `slot`, through a
    physical replication slot of that name."""
    with server_copy(template, *settings) as primary:
        standby = _server(template.bin_dir, template.user)
        try:
            try:
                standby.clone_from(primary, *(("-C", "-S", slot) if slot else ()))
                standby.start(*settings, *standby_settings)
            except (subprocess.SubprocessError, OSError) as exc:
                detail = getattr(exc, "stderr", b"") or b""
                pytest.skip(f"cannot start a standby: {exc} {detail.decode()[-300:]}")
            pair = ReplicaPair(primary, standby)
            pair.wait_until_the_standby_has_replayed_everything()
            yield pair
        finally:
            _remove(standby)


def _remove(server: PrivateServer) -> None:
    if server.running:
        with contextlib.suppress(subprocess.SubprocessError):
            server.stop()
    # The binaries are the template's: they stay until it goes.
    shutil.rmtree(server.root, ignore_errors=True)
