from __future__ import annotations

import click

from cronjob.cli import database_url_option, lock_wait_option
from cronjob.settings import Settings


@click.command()
@database_url_option
@lock_wait_option("another host's migration")
def migrate(database_url: str | None, lock_wait: float) -> None:
    """Apply pending schema migrations.

    Safe to run from several hosts at once: they queue on an advisory lock (saying so
    in the log, for at most --lock-wait) and the later ones find the work done.

    On a terminal, a migration that takes a while shows what it does and what it waits
    for (an index build's phase, the transaction it waits out). SIGINT or SIGTERM stops
    after the migration under way (exit 130 or 143); a second one stops at once.
    """
    from cronjob import db, location, schema
    from cronjob import migrate as migrations
    from cronjob.commands.progress import watching
    from cronjob.errors import DatabaseError, JobrunnerError
    from cronjob.log import get_logger

    url, source = location.resolve_url(Settings.build(database_url).database_url)
    conn = db.connect(url)
    progress = watching("migrating", told=_not_migrated, unit="migrations", timed=False)
    try:
        with db.database_errors(), progress as watch:
            applied = migrations.apply(conn, lock_wait=lock_wait, progress=watch)
    except DatabaseError as exc:
        if exc.sqlstate != db.INSUFFICIENT_PRIVILEGE:
            raise
        raise JobrunnerError(
            f"cannot migrate as role {conn.info.user}: {exc.primary}; "
            "run `jobrunner migrate` as the schema owner (jobrunner_owner in deploy/roles.sql)"
        ) from None
    finally:
        conn.close()
    log = get_logger()
    if applied:
        log.info(
            "migrated", applied=[f"{m.version:04d}_{m.name}" for m in applied], database=source
        )
    else:
        log.info("schema up to date", version=schema.latest_shipped_version(), database=source)


def _not_migrated(done: int) -> str:
    return (
        f"{done} migration(s) applied; the rest are not: `jobrunner migrate` again applies "
        "them (an index build it stopped is built again)"
    )
