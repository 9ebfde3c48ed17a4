"""`jobrunner batches` and `jobrunner batch show`: batches and how far their members got."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from cronjob.cli import database_url_option, json_option
from cronjob.commands import open_connection
from cronjob.commands.render import iso, table, when
from cronjob.errors import BadInput, JobrunnerError
from cronjob.inputs import parse_payload
from cronjob.models import BatchState
from cronjob.run_options import NewRun, checked_run


def then_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--then, --then-payload and --json: `enqueue --jsonl` as a batch."""
    for option in reversed(
        (
            click.option(
                "--then",
                "then_type",
                metavar="TYPE",
                help="With --jsonl: enqueue the lines as a batch, and a run of TYPE once every "
                "one of them has ended (exactly once); prints the batch id.",
            ),
            click.option("--then-payload", metavar="JSON", help="With --then: its run's payload."),
            click.option(
                "--json",
                "as_json",
                is_flag=True,
                help="With --then: the batch id and the run ids, as JSON.",
            ),
        )
    ):
        func = option(func)
    return func


def batch_callback(
    then_type: str | None, then_payload: str | None, as_json: bool, jsonl: bool,
    trace: dict[str, str],
) -> NewRun | None:  # fmt: skip
    """The callback of `--then`, checked, in the trace `trace`; None without it."""
    if then_type is None:
        if then_payload is not None or as_json:
            raise BadInput("--then-payload and --json go with --then")
        return None
    if not jsonl:
        raise BadInput("--then goes with --jsonl: the runs of the batch come from its lines")
    value = None if then_payload is None else parse_payload(then_payload, source="--then-payload")
    return checked_run(then_type, value, trace)


def batch_member(run: NewRun, batch_id: int) -> NewRun:
    """`run` as a member of batch `batch_id`."""
    return NewRun(run.job_type, run.payload_json, {**run.options, "batch_id": batch_id})


# The members `batch show` lists that did not succeed.
SHOWN_MEMBERS = 20


def _as_json(batch: BatchState) -> dict[str, Any]:
    return {
        "id": batch.id,
        "on": batch.on_outcome,
        "then": batch.then_type,
        "total": batch.total,
        "finished": batch.finished,
        "counts": batch.counts,
        "started_at": iso(batch.started_at),
        "ended_at": iso(batch.ended_at),
        "callback_run_id": batch.callback_run_id,
        "reason": batch.reason,
        "definition_id": batch.definition_id,
        "scheduled_for": iso(batch.scheduled_for),
    }


def _progress(batch: BatchState) -> str:
    if not batch.total:
        return "0/0"
    return f"{batch.finished}/{batch.total} ({100 * batch.finished // batch.total}%)"


@click.command("batches")
@database_url_option
@click.option("--limit", type=click.IntRange(1, 10000), default=50, show_default=True)
@json_option
def batches(database_url: str | None, limit: int, as_json: bool) -> None:
    """List batches, newest first, with their progress and callback."""
    from cronjob import store

    conn = open_connection(database_url)
    with conn:
        found = store.batches_list(conn, limit=limit)
    if as_json:
        click.echo(json.dumps([_as_json(b) for b in found], indent=2))
        return
    if not found:
        click.echo("no batches")
        return
    rows = [
        [str(b.id), b.then_type, _progress(b), when(b.started_at), when(b.ended_at),
         str(b.callback_run_id or ""), b.reason or ""]
        for b in found
    ]  # fmt: skip
    table(["ID", "THEN", "FINISHED", "STARTED", "ENDED", "CALLBACK", "REASON"], rows)


@click.group("batch")
def batch() -> None:
    """One batch: `jobrunner batch show ID`."""


@batch.command("show")
@click.argument("batch_id", metavar="ID")
@database_url_option
@json_option
def show(batch_id: str, database_url: str | None, as_json: bool) -> None:
    """A batch: its members by status, its progress, and its callback's run.

    The callback is enqueued once, when the last member ends; a member retried after that
    runs again, but the callback does not run again.
    """
    from cronjob import store
    from cronjob.inputs import parse_id

    number = parse_id(batch_id, what="batch id")
    conn = open_connection(database_url)
    with conn:
        found = store.batch_get(conn, number)
        if found is None:
            raise JobrunnerError(f"batch {number} not found")
        failed = store.batch_members_list(
            conn, number, statuses=["dead", "cancelled"], limit=SHOWN_MEMBERS
        )
    if as_json:
        click.echo(
            json.dumps({**_as_json(found), "not_succeeded": [i for i, _ in failed]}, indent=2)
        )
        return
    click.echo(f"batch {found.id}: then {found.then_type} (on {found.on_outcome})")
    click.echo(f"  finished  {_progress(found)}")
    for status, n in sorted(found.counts.items()):
        click.echo(f"  {status:<9} {n}")
    click.echo(f"  started   {when(found.started_at)}")
    if found.scheduled_for:
        click.echo(f"  for       {when(found.scheduled_for)} (schedule {found.definition_id})")
    if found.ended_at:
        click.echo(f"  ended     {when(found.ended_at)}")
    if found.callback_run_id:
        click.echo(f"  callback  run {found.callback_run_id}")
        if found.finished < found.total:
            click.echo("  (members retried since the callback run again; the callback does not)")
    elif found.reason:
        click.echo(f"  {found.reason}")
    if failed:
        click.echo("  not succeeded: " + ", ".join(f"{i} ({s})" for i, s in failed))


def run_relations(conn: Any, run_id: int) -> dict[str, Any]:
    """What `show` says of run `run_id`'s batch and dependencies, as --json prints it: `batch`
    (the run is a member of it or its callback), `waits_for`, `waited_for_by`; each only if
    the run has one."""
    from cronjob import store

    shown: dict[str, Any] = {}
    batch_id, role = store.batch_get_id_by_member(conn, run_id), "member"
    if batch_id is None:
        called_back = store.batch_get_by_callback(conn, run_id)
        batch_id, role = (called_back.id if called_back else None), "callback"
    found = None if batch_id is None else store.batch_get(conn, batch_id)
    if found is not None:
        shown["batch"] = {
            **_as_json(found),
            "role": role,
            "show": f"jobrunner batch show {found.id}",
        }
    dependencies = store.dependencies_get(conn, run_id)
    if dependencies.parents:
        shown["waits_for"] = {
            "after_policy": dependencies.parent[0][2],
            "total": dependencies.parents,
            "runs": [{"id": i, "status": s} for i, s, _ in dependencies.parent],
            "more": dependencies.more_parents,
        }
    if dependencies.children:
        shown["waited_for_by"] = {
            "total": dependencies.children,
            "runs": [{"id": i, "status": s} for i, s, _ in dependencies.child],
            "more": dependencies.more_children,
        }
    return shown


def echo_run_relations(shown: dict[str, Any]) -> None:
    """`show`'s text of what run_relations found."""
    batch = shown.get("batch")
    if batch:
        role = "a member" if batch["role"] == "member" else "the callback"
        click.echo(f"\nbatch {batch['id']}: this run is {role} (`{batch['show']}`)")
        finished = f"{batch['finished']}/{batch['total']}"
        counts = ", ".join(f"{s} {n}" for s, n in sorted(batch["counts"].items()))
        click.echo(f"  finished  {finished}{f' ({counts})' if counts else ''}")
        callback = batch["callback_run_id"]
        click.echo(f"  callback  {f'run {callback}' if callback else batch['reason'] or 'not yet'}")
    for key, title in (("waits_for", "waits for"), ("waited_for_by", "waited for by")):
        side = shown.get(key)
        if not side:
            continue
        policy = f" (--after-policy {side['after_policy']})" if "after_policy" in side else ""
        click.echo(f"\n{title} {side['total']} run(s){policy}:")
        for run in side["runs"]:
            click.echo(f"  {run['id']}  {run['status']}")
        if side["more"]:
            click.echo(f"  and {side['more']:,} more")
