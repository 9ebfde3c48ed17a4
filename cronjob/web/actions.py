"""What the dashboard changes, with --allow-actions: retry and cancel (one run, or a filtered
set after a confirmation that shows its dry-run count), pause and resume a job type or a
schedule, and run a schedule now.

Each is the command line's own function (cronjob.incident, cronjob.operations) and writes
the same `job_audit` row, its actor the authenticated user (basic authentication, or the
host application's) or, for a session of the login link `jobrunner web` prints, `--actor`.
Every post reaches here only through the guard (cronjob.web.application: actions on, a
known login, same origin) and carries this browser's form token.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

from cronjob.errors import BadInput
from cronjob.web.pages import RUN_FILTERS, base_path, checked_parameter, dashboard_of, link, render

# A form of the dashboard's is a few fields; anything much larger is not one of its forms.
MAX_FORM_BYTES = 64_000
SELECTION_COMMANDS = ("retry", "cancel")
TYPE_COMMANDS = ("pause", "resume")
SCHEDULE_COMMANDS = ("pause", "resume", "run")


def routes() -> list[Any]:
    from starlette.routing import Route

    return [
        Route("/actions/confirm", confirm, name="confirm"),
        Route("/actions/runs", act_on_selection, methods=["POST"], name="act_on_selection"),
        Route("/actions/runs/{run_id:int}", act_on_run, methods=["POST"], name="act_on_run"),
        Route("/actions/types", act_on_type, methods=["POST"], name="act_on_type"),
        Route("/actions/schedules", act_on_schedule, methods=["POST"], name="act_on_schedule"),
    ]


def actor_of(request: Any) -> str:
    """Who acts: the user basic authentication or the host application proved, else, for a
    session of the login link, the dashboard's --actor (JOBRUNNER_ACTOR, user@host): who
    started it, and was shown the link. The guard let no action through without one."""
    from cronjob.incident import actor_name
    from cronjob.web.guard import logged_in

    return actor_name(logged_in(request.scope) or dashboard_of(request).settings.actor)


def _chosen(value: str | None, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise BadInput(f"unknown action {value!r}: expected one of {', '.join(allowed)}")
    return value


def _reason(form: Mapping[str, str]) -> str | None:
    from cronjob.inputs import check_text

    text = form.get("reason", "").strip()
    return check_text(text, what="reason", max_length=1000) if text else None


def _selection(conn: Any, params: Mapping[str, str], command: str) -> Any:
    """The filtered runs `command` would act on, with the clock pinned: runs that change after
    this moment leave the selection, so a confirmed action never reaches more runs than its
    dry run counted."""
    from dataclasses import replace

    from cronjob import incident
    from cronjob.inputs import parse_statuses
    from cronjob.web.pages import run_selection

    if params.get("status", "").strip():
        parse_statuses(params["status"], allowed=incident.action(command).eligible, command=command)
    selection = run_selection(conn, params)
    if not selection.filtered:
        raise BadInput(f"give filters (status, type, ...) of the runs to {command}")
    from cronjob import store

    clock = store.clock_now(conn)
    return replace(selection, until=min(selection.until or clock, clock))


def confirm(request: Any) -> Any:
    """What a filtered retry or cancel would change (the dry run), and the form that does it."""
    from cronjob import incident

    params = request.query_params
    command = _chosen(params.get("command"), SELECTION_COMMANDS)
    with dashboard_of(request).connections.connection() as conn:
        selection = _selection(conn, params, command)
        found = incident.count(conn, incident.action(command), selection)
    pinned = {name: params.get(name, "") for name in RUN_FILTERS}
    pinned.update(
        since=selection.since.isoformat() if selection.since else "",
        until=selection.until.isoformat() if selection.until else "",
    )
    back = link(base_path(request), "/runs", {n: params.get(n) for n in RUN_FILTERS})
    return render(
        request,
        "confirm.html",
        command=command,
        found=found,
        pinned=pinned,
        back=back,
        selection=selection.as_json(),
    )


async def _form(request: Any) -> dict[str, str]:
    """The posted form, once its token is checked: a post without this browser's token is
    refused before anything is read from the database."""
    from cronjob.web.guard import CSRF_COOKIE, CSRF_FIELD

    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise Refused("expected a form")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise Refused("form too large")
    try:
        form = dict(parse_qsl(body.decode(), keep_blank_values=True, max_num_fields=40))
    except (UnicodeDecodeError, ValueError):
        raise Refused("unreadable form") from None
    if not dashboard_of(request).csrf.matches(
        request.cookies.get(CSRF_COOKIE), form.get(CSRF_FIELD)
    ):
        raise Refused("missing or wrong form token: reload the page and try again")
    return form


class Refused(Exception):
    """A post refused before it did anything (403)."""


async def _run(request: Any, work: Any) -> Any:
    """Read the form, then do `work(conn, form, actor)` in a worker thread; its URL is where
    the browser goes next."""
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import PlainTextResponse, RedirectResponse

    try:
        form = await _form(request)
    except Refused as exc:
        return PlainTextResponse(f"{exc}\n", status_code=403)
    actor = actor_of(request)

    def step() -> str:
        with dashboard_of(request).connections.connection() as conn:
            return work(conn, form, actor)

    target = await run_in_threadpool(step)
    return RedirectResponse(base_path(request) + target, status_code=303)


async def act_on_selection(request: Any) -> Any:
    """Retry or cancel the runs a confirmation showed, batch by batch, in one audit entry."""
    from cronjob import incident

    def work(conn: Any, form: dict[str, str], actor: str) -> str:
        command = _chosen(form.get("command"), SELECTION_COMMANDS)
        selection = _selection(conn, form, command)
        applied = incident.apply(
            conn, incident.action(command), selection, actor=actor, reason=_reason(form)
        )
        done = "retried" if command == "retry" else "cancelled"
        return f"/audit?entry={applied.audit_id}&done={done}"

    return await _run(request, work)


async def act_on_run(request: Any) -> Any:
    """Retry or cancel one run, as `jobrunner retry ID` does."""
    from cronjob import operations

    run_id = request.path_params["run_id"]

    def work(conn: Any, form: dict[str, str], actor: str) -> str:
        command = _chosen(form.get("command"), SELECTION_COMMANDS)
        operations.change_runs(conn, command, [run_id], actor=actor, reason=_reason(form))
        done = "retried-run" if command == "retry" else "cancelled-run"
        return f"/runs/{run_id}?done={done}"

    return await _run(request, work)


async def act_on_type(request: Any) -> Any:
    """Pause or resume claiming a job type on every host, as `jobrunner pause` does."""
    from cronjob import operations
    from cronjob.inputs import check_text

    def work(conn: Any, form: dict[str, str], actor: str) -> str:
        command = _chosen(form.get("command"), TYPE_COMMANDS)
        job_type = check_text(form.get("job_type"), what="job type", max_length=200)
        change = operations.pause_types if command == "pause" else operations.resume_types
        done = change(conn, [job_type], actor=actor, reason=_reason(form))
        return f"/audit?entry={done.audit_id}&done={command}d-type"

    return await _run(request, work)


async def act_on_schedule(request: Any) -> Any:
    """Pause, resume or run now a schedule, as `jobrunner schedule pause/resume/run` do."""
    from cronjob import operations

    settings = dashboard_of(request).settings

    def work(conn: Any, form: dict[str, str], actor: str) -> str:
        command = _chosen(form.get("command"), SCHEDULE_COMMANDS)
        name, reason = checked_parameter(form.get("name", ""), "schedule name"), _reason(form)
        if command == "pause":
            audit_id = operations.pause_schedule(conn, name, actor=actor, reason=reason).audit_id
        elif command == "resume":
            _, done = operations.resume_schedule(conn, name, actor=actor, reason=reason)
            audit_id = done.audit_id
        else:
            audit_id = operations.run_schedule_now(
                conn, name, actor=actor, reason=reason, tenants_sql=settings.tenants_sql
            ).audit_id
        said = {"pause": "paused", "resume": "resumed", "run": "ran"}[command]
        return f"/audit?entry={audit_id}&done={said}-schedule"

    return await _run(request, work)
