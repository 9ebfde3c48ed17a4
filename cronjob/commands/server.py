"""`jobrunner server`: the embedded PostgreSQL server, seen, reached from other code, stopped."""

from __future__ import annotations

import click

from cronjob.cli import json_option


@click.group()
def server() -> None:
    """The embedded PostgreSQL server (extra `embedded`), used when no database URL is
    configured.

    It lives in ~/.local/share/jobrunner/pgdata (or $JOBRUNNER_DATA_DIR/pgdata), listens
    only on a Unix socket only you can reach, and keeps running between commands. It does
    not run as root.
    """


@server.command()
@json_option
def status(as_json: bool) -> None:
    """Whether the embedded server runs: its data directory, URL and process id.

    Starts nothing. Exit 0 whether it runs or not.
    """
    from cronjob import embedded

    found = embedded.state()
    if as_json:
        import json

        shown = {
            "running": found.running,
            "data_dir": str(found.data_dir),
            "url": found.url,
            "pid": found.pid,
        }
        click.echo(json.dumps(shown))
        return
    click.echo(f"running:   {'yes' if found.running else 'no'}")
    click.echo(f"data dir:  {found.data_dir}")
    if found.running:
        click.echo(f"url:       {found.url}")
        click.echo(f"pid:       {found.pid}")


@server.command()
def url() -> None:
    """Print the embedded server's URL alone, starting (and migrating) it if needed.

    For your own code to enqueue on the same database:
    `export JOBRUNNER_DATABASE_URL=$(jobrunner server url)`. It holds no password: only
    your user can reach the socket it names.
    """
    from cronjob.commands import open_database
    from cronjob.settings import Settings

    database, conn = open_database(Settings.build(None), embedded_only=True)
    conn.close()
    click.echo(database.url)


@server.command()
def stop() -> None:
    """Stop the embedded server. Exit 0 whether it was running or not; the line says which.

    A fast shutdown: open connections are ended and their transactions rolled back, so
    stop it while no tick runs. The next command that needs it starts it again; its data
    stays in the data directory.
    """
    from cronjob import embedded

    ran = embedded.stop()
    if ran is None:
        pgdata = embedded.data_dir() / "pgdata"
        click.echo(f"the embedded server was not running (data dir {pgdata})")
    else:
        click.echo(f"stopped the embedded server (pid {ran.pid}, data dir {ran.data_dir})")
