"""The dashboard's pages: each reads what it shows through the store, as `status`, `list`,
`show`, `schedule list/show` and `audit` do, and renders one template.

Every page costs the same however much finished history the table keeps: counts come from
the snapshot `status` reads (cronjob.health over the tally and the active indexes), lists
are keyset pages (cronjob.store.dashboard), one run or schedule is read by its key. URLs
take the command line's filters as query parameters, so a page can be bookmarked and sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from cronjob.db import INSUFFICIENT_PRIVILEGE
from cronjob.errors import (
    BadInput,
    DatabaseError,
    DefinitionNotFound,
    JobrunnerError,
    RunNotFound,
    SchemaNotReady,
)
from cronjob.models import Selection, Status
from cronjob.text import redact


class BatchNotFound(JobrunnerError):
    """No batch of the id a page names."""


PAGE_SIZE = 50
AUDIT_PAGE_SIZE = 50
# Ids a filtered page of runs reads at most when no index finds its runs (a type, a tenant,
# an error among finished runs): the cost of a page stays the same however long the history,
# and the next page searches on below.
RUN_WINDOW = 20_000
# The filters of /runs, as the command line names them, and the Selection field each fills.
RUN_FILTERS = {
    "status": "statuses",
    "type": "job_types",
    "tenant": "tenants",
    "error_type": "error_types",
    "schedule": "schedule",
    "batch": "batch_id",
    "since": "since",
    "until": "until",
}
RECENT_SHOWN = 10
# The ticks that did more than look, on the overview; idle ones are counted by host.
RECENT_TICKS_SHOWN = 10
# The longest query parameter a filter takes: a list of job types or tenants.
MAX_PARAMETER = 10_000
UPCOMING_SHOWN = 5
# What an action's page says once it is done (`?done=NAME` in the address it redirects to):
# chosen here from a fixed set, never text from the request; `{run}` is the page's run id.
DONE = {
    "retried-run": "Retried run {run}: it is due now.",
    "cancelled-run": "Cancelled run {run}.",
    "retried": "Retried the selected runs: the entry below says how many.",
    "cancelled": "Cancelled the selected runs: the entry below says how many.",
    "paused-type": "Paused the job type: no tick claims its runs until it is resumed.",
    "resumed-type": "Resumed the job type.",
    "paused-schedule": "Paused the schedule.",
    "resumed-schedule": "Resumed the schedule.",
    "ran-schedule": "Enqueued the schedule's run now.",
}
# The pages whose content changes on its own, which reload themselves unless paused (a form
# page, the confirmation, never does).
REFRESHED = frozenset({"overview.html", "runs.html", "run.html", "batch.html", "batches.html"})
# The status tabs of /runs, in a run's order of life, after "all".
STATUS_TABS = ("queued", "running", "waiting", "failed", "succeeded", "dead", "cancelled")


def routes() -> list[Any]:
    from starlette.routing import Route

    return [
        Route("/", overview, name="overview"),
        Route("/runs", runs, name="runs"),
        Route("/runs/{run_id:int}", run, name="run"),
        Route("/schedules", schedules, name="schedules"),
        Route("/schedules/{name:path}", schedule, name="schedule"),
        Route("/batches", batches, name="batches"),
        Route("/batches/{batch_id:int}", batch, name="batch"),
        Route("/audit", audit, name="audit"),
        Route("/healthz", healthz, name="healthz"),
        Route("/static/dashboard.css", stylesheet, name="stylesheet"),
        Route("/static/refresh.js", script, name="script"),
    ]


def exception_handlers() -> dict[Any, Any]:
    return {JobrunnerError: _error_page}


# -- rendering ------------------------------------------------------------------


def dashboard_of(request: Any) -> Any:
    return request.app.state.dashboard


def base_path(request: Any) -> str:
    """The prefix the dashboard is mounted under ("" when it is served on its own)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def render(request: Any, template: str, *, status_code: int = 200, **values: Any) -> Any:
    """A page: the template with what every page shows, and this browser's form token."""
    from starlette.responses import HTMLResponse

    from cronjob.web.guard import CSRF_COOKIE, logged_in

    dashboard = dashboard_of(request)
    settings = dashboard.settings
    # Buttons, and the form token, for a known login only: the guard refuses the rest.
    actions = settings.allow_actions and logged_in(request.scope) is not None
    token = request.cookies.get(CSRF_COOKIE)
    fresh = actions and not dashboard.csrf.valid(token)
    if fresh:
        token = dashboard.csrf.issue()
    html = dashboard.templates.get_template(template).render(
        base=base_path(request),
        actions=actions,
        login_needed=settings.allow_actions and not actions,
        login_link=settings.login_token is not None,
        show_payloads=settings.show_payloads,
        show_logs=settings.show_logs,
        csrf_token=token or "",
        link=link,
        flash=done_message(request),
        refresh=settings.refresh_seconds if template in REFRESHED else 0,
        **values,
    )
    response = HTMLResponse(html, status_code=status_code)
    if fresh:
        response.set_cookie(
            CSRF_COOKIE,
            token or "",
            path=base_path(request) or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
    return response


def done_message(request: Any) -> str | None:
    """What the action that led here did, from the fixed set DONE; None for anything else."""
    message = DONE.get(request.query_params.get("done", ""))
    if message is None:
        return None
    return message.format(run=request.path_params.get("run_id", ""))


def link(base: str, path: str, params: Mapping[str, Any] | None = None) -> str:
    """A URL of the dashboard's, its query built from `params` (empty values left out)."""
    query = urlencode({k: v for k, v in (params or {}).items() if v not in (None, "")})
    return f"{base}{path}" + (f"?{query}" if query else "")


def schedule_path(name: str) -> str:
    return "/schedules/" + quote(name, safe="")


def _error_page(request: Any, exc: Exception) -> Any:
    status = 500
    if isinstance(exc, RunNotFound | DefinitionNotFound | BatchNotFound):
        status = 404
    elif isinstance(exc, BadInput):
        status = 400
    elif isinstance(exc, DatabaseError) and exc.sqlstate == INSUFFICIENT_PRIVILEGE:
        status = 403
    elif isinstance(exc, DatabaseError | SchemaNotReady):
        status = 503
    return render(request, "error.html", status_code=status, message=redact(str(exc)))


def _connection(request: Any) -> Any:
    return dashboard_of(request).connections.connection()


# -- pages ----------------------------------------------------------------------


def overview(request: Any) -> Any:
    """Counts by status and type, what waits and for how long, paused and unclaimed types,
    stale schedules, and the last day's charts."""
    from cronjob import health, store
    from cronjob.settings import LISTENING_TICK_STALE

    with _connection(request) as conn:
        view = health.read_overview(conn)
        day = store.runs_chart_last_day(conn, now=view.now)
        stale = [v for v in _schedule_health(conn).values() if v.stale]
        ticks = store.ticks_list(conn, stale=LISTENING_TICK_STALE, now=view.now)
        recent = store.ticks_list_recent(conn, limit=RECENT_TICKS_SHOWN)
        hosts = store.ticks_count_idle_by_host(conn, now=view.now)
    from cronjob.web import charts

    return render(
        request,
        "overview.html",
        view=view,
        now=view.now,
        stale=stale,
        ticks=ticks,
        recent_ticks=recent,
        tick_hosts=hosts,
        unclaimed=view.unclaimed(),
        statuses=[s.value for s in Status],
        finished=charts.finished_per_minute(day, view.now),
        waited=charts.longest_wait(day, view.now),
    )


def _schedule_health(conn: Any) -> dict[str, Any]:
    from cronjob import store
    from cronjob.staleness import assess

    return {row.name: assess(row) for row in store.definitions_list_health(conn)}


def run_selection(conn: Any, params: Mapping[str, str]) -> Selection:
    """The runs a page's query parameters select, as `jobrunner list` and `retry` read their
    options; a blank parameter is no filter."""
    from cronjob import incident
    from cronjob.inputs import parse_statuses

    given = {
        name: checked_parameter(params[name], name).strip()
        for name in RUN_FILTERS
        if params.get(name, "").strip()
    }
    statuses = parse_statuses(given["status"]) if "status" in given else None
    options = {RUN_FILTERS[name]: value for name, value in given.items() if name != "status"}
    selection = incident.build_selection(None, statuses or None, options)
    return incident.with_clock(conn, selection, options)


def checked_parameter(value: str, name: str) -> str:
    """A query parameter or form field as text a filter or name may hold: none holds a NUL
    (which no column can store), and none is longer than a few lists of names."""
    from cronjob.inputs import check_text

    return check_text(value, what=name, max_length=MAX_PARAMETER, allow_empty=True)


def runs(request: Any) -> Any:
    """A page of runs, newest first, filtered as `jobrunner list` and `retry` filter."""
    from cronjob import store
    from cronjob.inputs import parse_id

    params = request.query_params
    before = parse_id(params["before"], what="before") if params.get("before") else None
    with _connection(request) as conn:
        selection = run_selection(conn, params)
        page = store.runs_list_page(
            conn, selection, before=before, limit=PAGE_SIZE, window=run_window(selection)
        )
        counts, counted_among = _status_counts(conn, selection)
        now = store.clock_now(conn)
    filters = {name: params.get(name, "") for name in RUN_FILTERS}
    return render(
        request,
        "runs.html",
        page=page,
        filters=filters,
        filtered=selection.filtered,
        windowed=run_window(selection) is not None,
        before=before,
        now=now,
        counts=counts,
        counted_among=counted_among,
        tabs=STATUS_TABS,
        window=RUN_WINDOW,
    )


def run_window(selection: Selection) -> int | None:
    """No window when an index finds the runs whatever the history and the backlog: no
    filter at all (the primary key), or running runs only (their partial index holds as many
    as are running). Waiting runs are as many as were enqueued: no index lists them newest
    first, so a page of them searches a window of ids, as a filter over history does."""
    from cronjob import store

    if not selection.filtered:
        return None
    if selection.statuses and set(selection.statuses) <= store.RUNNING:
        return None
    return RUN_WINDOW


def _status_counts(conn: Any, selection: Selection) -> tuple[dict[str, int], int | None]:
    """The status tabs' counts: the runs of the page's filters (its status aside) by status,
    and among how many of the newest ids they were counted (None: all of them).

    Job types alone are counted exactly, from the tally `status` reads. Any other filter
    (a tenant, an error, a time) is counted in one statement over the newest ids a page
    searches, so its cost is the window's whatever the history."""
    from dataclasses import replace

    from cronjob import health, store

    others = replace(selection, statuses=None, job_types=None)
    if not others.filtered:
        view = health.read_overview(conn)
        wanted = selection.job_types
        types = [t for t in view.types if not wanted or t.job_type in wanted]
        return {s.value: sum(t.by_status[s.value] for t in types) for s in Status}, None
    counts, whole = store.runs_count_by_status(conn, selection, window=RUN_WINDOW)
    return counts, None if whole else RUN_WINDOW


def run(request: Any) -> Any:
    """One run: every field, its failed attempts, and, when shown, the payload, the last
    traceback and what its handler logged in each attempt (as `show` prints it)."""
    from cronjob import store
    from cronjob.runlog import event_line
    from cronjob.web import present

    run_id = request.path_params["run_id"]
    show_logs = dashboard_of(request).settings.show_logs
    with _connection(request) as conn:
        found = store.run_get(conn, run_id)
        if found is None:
            raise RunNotFound(f"run {run_id} not found")
        attempts = store.run_attempts_get(conn, run_id)
        # A handler logs what it likes (a card number, a key): not read unless shown.
        logs = store.run_logs_get(conn, run_id) if show_logs else []
        links = _run_links(conn, run_id)
        traceparent = store.run_get_traceparent(conn, run_id)
        now = store.clock_now(conn)
    # A kept event that is no object was written by someone else's SQL: left out, as by `show`.
    logged = [(log, [event_line(e) for e in log.events if isinstance(e, dict)]) for log in logs]
    trace = present.trace_id(traceparent)
    return render(
        request,
        "run.html",
        run=found,
        attempts=attempts,
        logs=logged,
        now=now,
        trace_id=trace,
        trace_url=present.trace_url(dashboard_of(request).settings.trace_url_template, trace),
        **links,
    )


def _run_links(conn: Any, run_id: int) -> dict[str, Any]:
    """The batch a run is a member of, the one it is the callback of, and the runs it waits
    for and that wait for it."""
    from cronjob import store

    called_back = store.batch_get_by_callback(conn, run_id)
    return {
        "member_of": store.batch_get_id_by_member(conn, run_id),
        "callback_of": called_back.id if called_back else None,
        "dependencies": store.dependencies_get(conn, run_id),
    }


def batches(request: Any) -> Any:
    """The newest batches, each with its progress and callback."""
    from cronjob import store

    with _connection(request) as conn:
        found = store.batches_list(conn, limit=PAGE_SIZE)
        now = store.clock_now(conn)
    return render(request, "batches.html", batches=found, now=now)


def batch(request: Any) -> Any:
    """One batch: its members by status (each a link to those runs), progress, callback."""
    from cronjob import store

    batch_id = request.path_params["batch_id"]
    with _connection(request) as conn:
        found = store.batch_get(conn, batch_id)
        now = store.clock_now(conn)
    if found is None:
        raise BatchNotFound(f"batch {batch_id} not found")
    return render(request, "batch.html", batch=found, now=now)


def schedules(request: Any) -> Any:
    """Every schedule: its timing, next fire time, overlap policy and health."""
    from cronjob import store

    with _connection(request) as conn:
        found = store.definitions_list(conn)
        verdicts = _schedule_health(conn)
        now = store.clock_now(conn)
    rows = [(d, verdicts.get(d.name), _upcoming(d, 1)) for d in found]
    return render(request, "schedules.html", rows=rows, now=now, path_of=schedule_path)


def schedule(request: Any) -> Any:
    """One schedule: settings, next fire times, health, its newest runs and skips."""
    from cronjob import definitions, store
    from cronjob.staleness import assess

    name = checked_parameter(request.path_params["name"], "schedule name")
    with _connection(request) as conn:
        found = definitions.get(conn, name)
        health_row = store.definition_get_health(conn, found.id)
        recent = store.definition_runs_list_recent(conn, found.id, limit=RECENT_SHOWN)
        skips = store.definition_skips_list_recent(conn, found.id, limit=RECENT_SHOWN)
        latest = store.definition_runs_count_latest_occurrence(conn, found.id)
        now = store.clock_now(conn)
    if health_row is None:
        raise DefinitionNotFound(f"schedule {name!r} not found")
    return render(
        request,
        "schedule.html",
        definition=found,
        verdict=assess(health_row),
        recent=recent,
        skips=skips,
        latest=latest,
        now=now,
        upcoming=_upcoming(found, UPCOMING_SHOWN),
        path=schedule_path(found.name),
    )


def _upcoming(definition: Any, count: int) -> list[Any] | str:
    """The next fire times, or why there are none to show (a row no command would write)."""
    from cronjob import definitions

    try:
        return definitions.upcoming_fire_times(definition, count)
    except Exception as exc:
        return f"cannot be evaluated ({type(exc).__name__})"


def audit(request: Any) -> Any:
    """Who did what, newest first: one entry per state-changing command, from either door."""
    from cronjob import store
    from cronjob.inputs import parse_id

    params = request.query_params
    before = parse_id(params["before"], what="before") if params.get("before") else None
    entry = parse_id(params["entry"], what="entry") if params.get("entry") else None
    if entry is not None and before is None:
        before = entry + 1
    with _connection(request) as conn:
        entries = store.audit_list_page(conn, before=before, limit=AUDIT_PAGE_SIZE + 1)
        now = store.clock_now(conn)
    older = entries[AUDIT_PAGE_SIZE - 1].id if len(entries) > AUDIT_PAGE_SIZE else None
    return render(
        request,
        "audit.html",
        entries=entries[:AUDIT_PAGE_SIZE],
        older=older,
        before=before,
        entry=entry,
        now=now,
    )


def healthz(request: Any) -> Any:
    """For probes: 200 with the queue's headline numbers, 503 when the database is not
    reachable or its schema not ready."""
    from starlette.responses import JSONResponse

    from cronjob import health
    from cronjob.text import redact

    try:
        with _connection(request) as conn:
            view = health.read_overview(conn)
    except (DatabaseError, SchemaNotReady) as exc:
        return JSONResponse({"ok": False, "error": redact(str(exc))}, status_code=503)
    return JSONResponse(
        {
            "ok": True,
            "due": view.due,
            "oldest_due_age_seconds": view.oldest_due_age,
            "expired_leases": view.expired_leases,
            "dead": view.dead,
            "paused_job_types": sorted(view.paused_types),
            "now": view.now.isoformat(),
        }
    )


def stylesheet(request: Any) -> Any:
    return _static("dashboard.css", "text/css")


def script(request: Any) -> Any:
    return _static("refresh.js", "text/javascript")


def _static(name: str, media_type: str) -> Any:
    from pathlib import Path

    from starlette.responses import Response

    body = (Path(__file__).resolve().parent / "static" / name).read_bytes()
    return Response(body, media_type=media_type, headers={"Cache-Control": "max-age=3600"})
