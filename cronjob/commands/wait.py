from __future__ import annotations

import json
from typing import Any

import click

from cronjob.cli import database_url_option, json_option
from cronjob.commands import open_connection
from cronjob.commands.render import iso


def _timeout(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    from cronjob.errors import BadInput
    from cronjob.inputs import parse_duration

    try:
        return parse_duration(value, what="--timeout")
    except BadInput as exc:
        raise click.BadParameter(str(exc)) from None


@click.command()
@click.argument("run_ids", metavar="ID...", nargs=-1, required=True)
@click.option(
    "--timeout",
    metavar="DURATION",
    callback=_timeout,
    help="Give up after this long: exit 124, with each run's status so far. Default: wait "
    "for as long as it takes.",
)
@database_url_option
@json_option
def wait(
    run_ids: tuple[str, ...], timeout: float | None, database_url: str | None, as_json: bool
) -> None:
    """Wait until every run named has finished, then print each run's status.

    Returns within milliseconds of the last finish (the finalize notifies; nothing is
    polled). Exit 0 if every run succeeded, 1 if any is dead or cancelled, 124 when
    --timeout passed first. --json prints the runs as rows (id, status, finished_at).
    """
    from cronjob.errors import WaitTimedOut
    from cronjob.inputs import parse_run_ids
    from cronjob.waiting import wait as wait_for

    ids = parse_run_ids(run_ids)
    conn = open_connection(database_url)
    with conn:
        try:
            outcomes = wait_for(conn, ids, timeout=timeout)
        except WaitTimedOut as exc:
            _print(exc.outcomes, as_json)
            raise
    _print(outcomes, as_json)
    failed = [o for o in outcomes if o.status != "succeeded"]
    if failed:
        raise click.exceptions.Exit(1)


def _print(outcomes: list[Any], as_json: bool) -> None:
    if as_json:
        rows = [{"id": o.id, "status": str(o.status), "finished_at": iso(o.finished_at)}
                for o in outcomes]  # fmt: skip
        click.echo(json.dumps(rows, indent=2))
        return
    for o in outcomes:
        click.echo(f"{o.id} {o.status}")
