"""The dashboard that keeps up: status tabs counted for the filter, times said relative to the
database's clock, trace ids linked to a tracing UI, a confirmation chosen from a fixed set,
the audit's selections in words. Over real HTTP and the command line; what a browser does
with them is tests/test_web_alive_browser.py's.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from tests.conftest import run_cli
from tests.factories import insert_run, insert_runs
from tests.test_web import _rows_read
from tests.web_server import request, serving

pytest.importorskip("starlette")

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def dashboard(db_url: str, **options):
    from cronjob.web import app

    return app(db_url, **options)


def _tab_counts(body: str) -> dict[str, str]:
    found = re.findall(r'id="tab-(\w+)"[^>]*>\w+ <span class="n">([\d,]+)</span>', body)
    return dict(found)


def test_relative_times_read_as_a_person_says_them_from_the_pages_clock():
    from cronjob.web.present import duration, iso, relative

    now = datetime(2026, 1, 5, 9, 0, 0, tzinfo=UTC)
    assert relative(now - timedelta(minutes=3, seconds=10), now) == "3 min ago"
    assert relative(now + timedelta(seconds=20), now) == "in 20 s"
    assert relative(now - timedelta(hours=2, minutes=5), now) == "2 h 5 min ago"
    assert relative(now - timedelta(days=3, hours=1), now) == "3 d ago"
    assert relative(now, now) == "just now"
    assert relative(None, now) == "-"
    assert iso(now) == "2026-01-05T09:00:00Z"
    assert duration(now - timedelta(seconds=95), now) == "1m35s"
    assert duration(None, now) == "-"


def test_status_tabs_count_the_runs_of_the_filter_by_status(db_url, conn):
    insert_runs(conn, 3, "send_email", status="dead", tenant_id="acme")
    insert_runs(conn, 2, "send_email", status="succeeded", tenant_id="acme")
    insert_runs(conn, 4, "send_email", tenant_id="acme")
    insert_runs(conn, 5, "send_email", status="dead", tenant_id="globex")
    insert_runs(conn, 6, "resize", status="succeeded")
    with serving(dashboard(db_url)) as base:
        by_tenant = request(base + "/runs?tenant=acme&status=dead").body
        by_type = request(base + "/runs?type=send_email").body
        everything = request(base + "/runs").body
    assert _tab_counts(by_tenant) == {
        "all": "9",
        "queued": "4",
        "running": "0",
        "waiting": "0",
        "failed": "0",
        "succeeded": "2",
        "dead": "3",
        "cancelled": "0",
    }
    assert 'class="tab tab-dead active"' in by_tenant
    assert "counted among" not in by_tenant  # the window held every run there is
    assert _tab_counts(by_type)["dead"] == "8" and _tab_counts(by_type)["all"] == "14"
    assert 'id="tab-all" href="/runs?type=send_email" aria-current="page"' in by_type
    assert _tab_counts(everything)["all"] == "20" and "counted among" not in everything


def test_status_tabs_count_a_window_of_ids_however_long_the_history(db_url):
    import psycopg

    from cronjob import store
    from cronjob.queries import dashboard as queries
    from cronjob.web import pages

    with psycopg.connect(db_url, autocommit=True) as conn:
        insert_runs(conn, 60_000, "done", status="succeeded", tenant_id="acme")
        conn.execute("ANALYZE job_runs")
        selection = pages.run_selection(conn, {"tenant": "acme"})
        counted, whole = store.runs_count_by_status(conn, selection, window=pages.RUN_WINDOW)
        _, among = pages._status_counts(conn, selection)
        params = {**store.dashboard._filter_params(selection), "floor": 60_001 - pages.RUN_WINDOW}
        [[plan]] = conn.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {queries.RUNS_COUNT_BY_STATUS}", params
        ).fetchone()
    assert counted["succeeded"] == pages.RUN_WINDOW and not whole
    assert among == pages.RUN_WINDOW  # the tabs say so
    assert _rows_read(plan["Plan"]) <= pages.RUN_WINDOW


def test_times_on_a_page_are_relative_with_the_utc_time_in_their_title(db_url, conn):
    run_id = insert_run(
        conn,
        "send_email",
        status="succeeded",
        started_at=datetime(2026, 1, 5, 9, 0, 0, tzinfo=UTC),
        finished_at=datetime(2026, 1, 5, 9, 1, 35, tzinfo=UTC),
    )
    with serving(dashboard(db_url)) as base:
        body = request(f"{base}/runs/{run_id}").body
    finished = re.search(r'<dd id="finished"><time datetime="([^"]+)" title="([^"]+)">', body)
    assert finished and finished.groups() == ("2026-01-05T09:01:35Z", "2026-01-05T09:01:35Z")
    assert "ago</time>" in body and "(took 1m35s)" in body


def test_a_runs_trace_id_links_to_the_tracing_ui_the_template_names(db_url, conn):
    run_id = insert_run(conn, "send_email", traceparent=TRACEPARENT)
    template = "https://ui.example/trace/{trace_id}?from=jobs"
    with serving(dashboard(db_url, trace_url_template=template)) as base:
        linked = request(f"{base}/runs/{run_id}").body
    with serving(dashboard(db_url)) as base:
        plain = request(f"{base}/runs/{run_id}").body
    assert f'<a href="https://ui.example/trace/{TRACE}?from=jobs"' in linked
    assert f"<code>{TRACE}</code>" in plain and "ui.example" not in plain


def test_a_trace_id_is_url_escaped_into_the_template():
    from cronjob.web.present import trace_id, trace_url

    assert trace_id(TRACEPARENT) == TRACE
    assert trace_id("garbage") is None
    url = trace_url("https://ui/t/{trace_id}", "a/b?c=d&e")
    assert url == "https://ui/t/a%2Fb%3Fc%3Dd%26e"


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("https://ui.example/trace/", "must contain {trace_id}"),
        ("javascript:alert(1)//{trace_id}", "must be an http:// or https:// URL"),
        ("ftp://ui.example/{trace_id}", "must be an http:// or https:// URL"),
        ("https:///{trace_id}", "must be an http:// or https:// URL"),
    ],
)
def test_web_refuses_a_trace_url_template_that_is_no_http_url_of_a_trace(db_url, template, said):
    result = run_cli("web", "--database-url", db_url, "--trace-url-template", template)
    assert result.exit_code == 2
    assert said in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_confirmation_is_chosen_from_a_fixed_set_never_echoed(db_url, conn):
    run_id = insert_run(conn, "send_email", status="dead")
    with serving(dashboard(db_url)) as base:
        said = request(f"{base}/runs/{run_id}?done=retried-run").body
        hostile = request(f"{base}/runs/{run_id}?done=<script>alert(1)</script>").body
    assert f'id="flash" role="status">Retried run {run_id}: it is due now.</p>' in said
    assert 'id="flash"' not in hostile and "alert(1)" not in hostile


def test_a_retried_run_shows_its_old_error_under_its_attempt_not_as_current(db_url, conn):
    run_id = insert_run(conn, "send_email", status="dead", attempts=1, last_error="SMTP down")
    conn.execute(
        "INSERT INTO job_attempts (run_id, attempt, error_type, message)"
        " VALUES (%s, 1, 'SMTPError', 'SMTP down')",
        (run_id,),
    )
    with serving(dashboard(db_url)) as base:
        dead = request(f"{base}/runs/{run_id}").body
        run_cli("retry", "--database-url", db_url, str(run_id), "--actor", "ann")
        retried = request(f"{base}/runs/{run_id}").body
    current = re.compile(r'id="last-error">(.*?)</dd>', re.S)
    assert "SMTP down" in current.search(dead).group(1)
    assert "SMTP down" not in current.search(retried).group(1)
    assert 'id="earlier-error"' in retried
    attempts = re.search(r'id="attempts">(.*?)</table>', retried, re.S).group(1)
    assert "SMTP down" in attempts


def test_the_overview_shows_the_recent_ticks_where_they_ran_and_what_they_did(db_url, conn):
    import os
    import socket

    import tests.handlers.basic  # noqa: F401 - registers test.ok, test.give_up
    from tests.factories import tick

    insert_runs(conn, 3, "test.ok")
    insert_run(conn, "test.give_up")
    tick(db_url, "test.ok", "test.give_up")
    tick(db_url, "test.ok")  # nothing left: idle
    with serving(dashboard(db_url)) as base:
        body = request(base + "/").body
    rows = re.findall(r'<tr class="tick">(.*?)</tr>', body, re.S)
    assert len(rows) == 1  # the idle tick is counted, not listed
    assert socket.gethostname() in rows[0] and f">{os.getpid()}<" in rows[0]
    assert "claimed 4: 3 succeeded, 0 failed, 1 dead" in rows[0]
    assert rows[0].count("<time datetime=") == 2  # started and ended, said relative to now
    hosts = re.search(r'id="tick-hosts">(.*?)</p>', body, re.S).group(1)
    assert "ticked 2 times (1 with nothing to do)" in hosts
    assert 'id="listening-now">0 listening now' in body


def test_the_audit_says_each_selection_in_words(db_url, conn):
    from cronjob.web.present import selection_words

    assert (
        selection_words({"status": ["dead"], "type": ["reports.send"], "tenant": ["acme"]})
        == "status = dead, type = reports.send, tenant = acme"
    )
    assert (
        selection_words(
            {
                "status": ["dead", "failed"],
                "error_like": "timeout",
                "until": "2026-01-05T09:00:00+00:00",
            }
        )
        == "status = dead or failed, error contains timeout, changed before 2026-01-05T09:00:00Z"
    )
    assert selection_words({"name": "nightly"}) == "name = nightly"
    assert selection_words({"rate_period": 60}) == "rate period = 60"

    insert_runs(conn, 2, "reports.send", status="dead", tenant_id="acme")
    result = run_cli(
        "retry", "--database-url", db_url, "--status", "dead", "--type", "reports.send",
        "--tenant", "acme", "--actor", "ann", "--yes",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    with serving(dashboard(db_url)) as base:
        body = request(base + "/audit").body
    cell = re.search(r'<td class="text selection">(.*?)</td>', body).group(1)
    assert cell.startswith("status = dead, type = reports.send, tenant = acme")
    assert "{" not in cell


def _level_at(svg: str, layer: str, x: int) -> float:
    """The height (from the bottom) of `layer`'s step line at minute `x` of a chart's SVG."""
    from cronjob.web.charts import HEIGHT

    path = re.search(rf'<path class="series {layer}" d="([^"]+)"', svg).group(1)
    level = float(HEIGHT)
    for px, py in re.findall(r"L([\d.]+),([\d.]+)", path):
        if float(px) > x:
            break
        level = float(py)
    return HEIGHT - level


def test_a_burst_among_quiet_minutes_is_drawn_on_a_labelled_log_scale(db_url):
    from cronjob.store.dashboard import ChartMinute
    from cronjob.web import charts

    now = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    minutes = [
        ChartMinute(now - timedelta(minutes=m), 1000 if m == 30 else 5, 0, 0, None)
        for m in range(1, 120)
    ]
    burst = charts.finished_per_minute(minutes, now)
    assert burst.scale == "log" and burst.peak == 1000
    assert burst.grid == (10.0, 100.0, 1000.0)
    quiet = _level_at(burst.svg, "succeeded", charts.MINUTES - 1 - 10)
    assert quiet > charts.HEIGHT / 5  # readable beside the burst, not a hairline
    assert _level_at(burst.svg, "succeeded", charts.MINUTES - 1 - 30) == charts.HEIGHT - 2
    assert 'aria-label="runs finished per minute, last 24 hours, log scale"' in burst.svg

    steady = [ChartMinute(now - timedelta(minutes=m), 5 + m % 3, 0, 0, None) for m in range(1, 60)]
    assert charts.finished_per_minute(steady, now).scale == "linear"


def test_the_overview_labels_a_chart_drawn_on_a_log_scale(db_url, conn):
    from psycopg import sql

    minutes = sql.SQL("now() - make_interval(mins => 2 + i % 60)")
    insert_runs(conn, 120, "send_email", status="succeeded", finished_at=minutes)
    insert_runs(conn, 1000, "send_email", status="succeeded", finished_at=sql.SQL("now()"))
    with serving(dashboard(db_url)) as base:
        body = request(base + "/").body
    label = re.search(r'id="finished-scale">(.*?)</span>', body).group(1)
    assert label == "log scale, a burst among quiet minutes: lines at 10, 100, 1,000 a minute"


def test_a_batchs_runs_page_lists_and_counts_its_members_alone(db_url, conn):
    from cronjob import enqueue_batch, new_run

    with conn.transaction():
        batch = enqueue_batch(
            conn, [new_run("mail", {}), new_run("mail", {})], then=new_run("report", {})
        )
    member = batch.run_ids[0]
    conn.execute(
        "UPDATE job_runs SET status = 'dead', finished_at = now() WHERE id = %s", (member,)
    )
    outsider = insert_run(conn, "mail", status="dead")
    with serving(dashboard(db_url)) as base:
        body = request(f"{base}/runs?batch={batch.id}&status=dead").body
    assert f'href="/runs/{member}"' in body and f'href="/runs/{outsider}"' not in body
    assert _tab_counts(body)["dead"] == "1" and _tab_counts(body)["all"] == "2"
