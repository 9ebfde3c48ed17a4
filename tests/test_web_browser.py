"""The dashboard in a real browser: Debian's headless Chromium, driven by Playwright (never a
browser of Playwright's own). What the operator sees, what a click changes, and what hostile
stored text can do in the page: nothing, checked in the browser itself.

`JOBRUNNER_WRITE_SCREENSHOTS=1` writes the screenshots of docs/guides/dashboard.md (docs/) from
these tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from tests.conftest import ROOT, count
from tests.factories import insert_run, insert_runs, now
from tests.web_server import jobrunner_web, serving

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    # A name a DNS rebinding attack has pointed at this machine.
    "--host-resolver-rules=MAP rebind.test 127.0.0.1",
]
SCREENSHOTS = ROOT / "docs"

pytest.importorskip("starlette")
playwright_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser tab that records every dialog a page opens (there must be none)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    tab = context.new_page()
    tab.dialogs = []
    tab.on("dialog", lambda dialog: (tab.dialogs.append(dialog.message), dialog.dismiss()))
    yield tab
    context.close()


LOGIN_TOKEN = "a-login-token-for-the-browser-tests"


def dashboard(db_url: str, **options: Any) -> Any:
    from cronjob.web import app

    # A page that reloads itself under a test could lose what the test just typed or read:
    # the refresh has tests of its own (test_web_alive_browser.py).
    options.setdefault("refresh_seconds", 0)
    return app(db_url, actor="operator-on-call", login_token=LOGIN_TOKEN, **options)


def _log_in(page: Any, base: str) -> None:
    """Open the login link, as the operator who started the dashboard does."""
    page.goto(f"{base}/?token={LOGIN_TOKEN}")
    assert page.url == base + "/"


def _seed_a_day(conn: Any) -> dict[str, int]:
    """A queue as an operator finds it: a day of finished runs, some dead, some waiting."""
    from cronjob import definitions, operations

    minutes = sql.SQL("now() - make_interval(mins => (i * 7) % 1440)")
    insert_runs(
        conn,
        400,
        "send_email",
        status="succeeded",
        finished_at=minutes,
        started_at=sql.SQL("now() - make_interval(mins => (i * 7) % 1440, secs => 3)"),
        run_at=sql.SQL("now() - make_interval(mins => (i * 7) % 1440, secs => 40)"),
    )
    insert_runs(conn, 120, "reports.nightly", status="succeeded", finished_at=minutes)
    dead = insert_run(
        conn,
        "send_email",
        status="dead",
        attempts=3,
        max_attempts=3,
        error_type="SMTPServerDisconnected",
        tenant_id="acme",
        last_error="Connection unexpectedly closed by smtp.example.com",
        payload={"to": "ada@example.com", "template": "receipt"},
        started_at=now("-31.6 seconds"),
    )
    for attempt in (1, 2, 3):
        conn.execute(
            "INSERT INTO job_attempts (run_id, attempt, worker, error_type, message, traceback,"
            " started_at, finished_at) VALUES (%s, %s, 'web-1:4242', 'SMTPServerDisconnected',"
            " %s, %s, now() - make_interval(mins => 9 - 3 * %s, secs => 31.6),"
            " now() - make_interval(mins => 9 - 3 * %s))",
            (
                dead,
                attempt,
                "Connection unexpectedly closed",
                'Traceback (most recent call last):\n  File "app/mail.py", line 42, in send\n'
                "    smtp.send_message(message)\nsmtplib.SMTPServerDisconnected: Connection "
                "unexpectedly closed",
                attempt,
                attempt,
            ),
        )
    insert_runs(
        conn,
        6,
        "send_email",
        status="dead",
        error_type="SMTPServerDisconnected",
        last_error="Connection unexpectedly closed",
    )
    insert_runs(conn, 25, "thumbnails.render", run_at=now("-4 minutes"))
    insert_runs(conn, 2, "thumbnails.render", status="running")
    spec = definitions.definition_spec(
        "nightly-report", cron="30 2 * * *", job_type="reports.nightly", timezone="Europe/Amsterdam"
    )
    definitions.add(conn, spec)
    operations.pause_types(conn, ["webhooks.deliver"], actor="ada", reason="partner API down")
    conn.execute("UPDATE job_runs SET traceparent = %s WHERE id = %s", (TRACEPARENT, dead))
    _seed_ticks(conn)
    return {"dead": dead}


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _seed_ticks(conn: Any) -> None:
    """The last hour's ticks on two hosts: cron's every minute, mostly idle, and one that
    stays (tick --listen)."""
    conn.execute(
        "INSERT INTO job_ticks (host, pid, started_at, last_seen, ended_at, stopped_by)"
        " SELECT 'web-1', 9000 + i, now() - make_interval(mins => i),"
        " now() - make_interval(mins => i), now() - make_interval(mins => i), 'idle'"
        " FROM generate_series(2, 59) i"
    )
    conn.execute(
        "INSERT INTO job_ticks (host, pid, started_at, last_seen, ended_at, stopped_by,"
        " materialized, rescued, claimed, succeeded, failed, dead) VALUES"
        " ('web-1', 8812, now() - interval '61 s', now() - interval '49 s',"
        "  now() - interval '49 s', NULL, 1, 0, 27, 25, 1, 1),"
        " ('web-2', 7310, now() - interval '3 min', now() - interval '2 min',"
        "  now() - interval '2 min', 'max-runtime', 0, 1, 200, 200, 0, 0)"
    )
    conn.execute(
        "INSERT INTO job_ticks (host, pid, started_at, listening_since, last_seen) VALUES"
        " ('web-2', 7344, now() - interval '40 s', now() - interval '39 s', now())"
    )


def _shoot(page: Any, name: str, tmp_path: Path) -> None:
    """A screenshot of what the page shows; into docs/ when asked for the dashboard guide's."""
    folder = SCREENSHOTS if os.environ.get("JOBRUNNER_WRITE_SCREENSHOTS") else tmp_path
    folder.mkdir(exist_ok=True)
    path = folder / f"dashboard-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_page_shows_the_seeded_runs_schedules_and_audit_rows(db_url, conn, page, tmp_path):
    seeded = _seed_a_day(conn)
    trace_url = "https://tracing.example/trace/{trace_id}"
    with serving(dashboard(db_url, show_logs=True, trace_url_template=trace_url)) as base:
        page.goto(base + "/")
        assert page.inner_text("#count-dead") == "7"
        assert page.locator("#ticks tr.tick").count() == 3
        assert page.inner_text("#listening-now").startswith("1 listening now")
        assert page.inner_text("#count-succeeded") == "520"
        assert "webhooks.deliver" in page.inner_text("#paused")
        assert "partner API down" in page.inner_text("#paused")
        assert page.locator("svg.chart path.succeeded").count() == 1
        assert "thumbnails.render" in page.inner_text("#types")
        _shoot(page, "overview", tmp_path)

        page.click("#types >> text=send_email")
        assert page.locator("#runs tr.run").count() == 50
        assert page.inner_text("#tab-dead .n") == "7"
        _shoot(page, "runs", tmp_path)
        page.goto(f"{base}/runs/{seeded['dead']}")
        assert page.inner_text("#job-type") == "send_email"
        assert page.locator("#attempts tr").count() == 4
        assert "smtplib.SMTPServerDisconnected" in page.inner_text("#traceback")
        assert page.is_visible("#payload-hidden") and "ada@example.com" not in page.content()
        trace = TRACEPARENT.split("-")[1]
        assert page.get_attribute("#trace a", "href") == f"https://tracing.example/trace/{trace}"
        _shoot(page, "run", tmp_path)

        page.goto(base + "/schedules")
        _shoot(page, "schedules", tmp_path)
        page.click("text=nightly-report")
        assert page.inner_text("#schedule-name") == "nightly-report"
        assert "Europe/Amsterdam" in page.inner_text("dl.fields")
        _shoot(page, "schedule", tmp_path)
        page.goto(base + "/audit")
        assert "pause" in page.inner_text("#audit") and "ada" in page.inner_text("#audit")
        _shoot(page, "audit", tmp_path)

        batch = _seed_a_batch(conn)
        page.goto(base + "/batches")
        assert f"/batches/{batch}" in page.inner_html("#batches")
        _shoot(page, "batches", tmp_path)
        page.click(f"#batches a[href$='/batches/{batch}']")
        assert page.get_attribute("#progress", "value") == "3"
        assert page.inner_text("#callback") == "not yet"
        _shoot(page, "batch", tmp_path)
        assert page.dialogs == []


def _seed_a_batch(conn: Any) -> int:
    """The weekly reports of five tenants, three of them sent, then one summary."""
    from cronjob import api

    runs = [
        api.new_run("reports.weekly", {"week": "2026-W48"}, tenant_id=f"t{i}") for i in range(5)
    ]
    batch = api.enqueue_batch(conn, runs, then=api.new_run("reports.summary", {}))
    conn.execute(
        "UPDATE job_runs SET status = 'succeeded', attempts = 1, finished_at = now()"
        " WHERE id = ANY(%s)",
        [list(batch.run_ids[:3])],
    )
    return batch.id


def test_filters_and_pages_walk_the_runs_newest_first_without_gaps(db_url, conn, page):
    ids = insert_runs(conn, 120, "resize", status="succeeded")
    dead = insert_runs(conn, 3, "resize", status="dead", error_type="Timeout")
    insert_runs(conn, 5, "other", status="dead")
    with serving(dashboard(db_url)) as base:
        page.goto(base + "/runs?type=resize")
        seen = []
        while True:
            seen += [int(t) for t in page.locator("#runs tr.run td:first-child").all_inner_texts()]
            if not page.locator("#older").count():
                break
            page.click("#older")
        assert seen == sorted(ids + dead, reverse=True)

        page.click("#tab-dead")
        page.fill("#filters input[name=error_type]", "Timeout")
        page.click("#filters button")
        assert "status=dead" in page.url and "error_type=Timeout" in page.url
        assert page.get_attribute("#tab-dead", "aria-current") == "page"
        shown = page.locator("#runs tr.run td:first-child").all_inner_texts()
        assert [int(t) for t in shown] == sorted(dead, reverse=True)


HOSTILE = {
    "job_type": "<script>window.__pwned = 'type'</script>",
    "tenant_id": '"><img src=x onerror="window.__pwned=\'tenant\'">',
    "last_error": "<a id=evil href=\"javascript:window.__pwned='link'\">fix</a>' \" </td></tr>",
    "error_type": "</table><svg onload=\"window.__pwned='svg'\"></svg>",
}


def test_hostile_stored_text_shows_as_text_and_runs_nothing(db_url, conn, page):
    payload = {
        "html": "</pre><script>window.__pwned='payload'</script><img src=x onerror=alert(1)>"
    }
    run_id = insert_run(
        conn,
        HOSTILE["job_type"],
        status="dead",
        payload=payload,
        **{k: v for k, v in HOSTILE.items() if k != "job_type"},
    )
    conn.execute(
        "INSERT INTO job_attempts (run_id, attempt, error_type, message, traceback)"
        " VALUES (%s, 1, %s, %s, %s)",
        (run_id, HOSTILE["error_type"], HOSTILE["last_error"], "<script>alert('tb')</script>"),
    )
    app = dashboard(db_url, allow_actions=True, show_payloads=True, show_logs=True)
    with serving(app) as base:
        _log_in(page, base)
        for path in (
            "/",
            "/runs",
            f"/runs?type={HOSTILE['job_type']}",
            f"/runs/{run_id}",
            "/runs?status=dead&error_type=x",
            "/audit",
        ):
            answer = page.goto(base + path)
            assert "script-src 'self';" in answer.headers["content-security-policy"]
            page.wait_for_load_state("load")
            assert page.evaluate("() => window.__pwned") is None, path
            # The dashboard's own script alone, from its own file.
            sources = page.evaluate("() => Array.from(document.scripts, s => s.src)")
            assert sources == [f"{base}/static/refresh.js"], path
            assert page.locator("img[src=x], svg[onload], #evil").count() == 0, path
            assert page.locator("a[href^='javascript']").count() == 0, path
        page.goto(f"{base}/runs/{run_id}")
        assert page.inner_text("#job-type") == HOSTILE["job_type"]
        assert page.inner_text("#tenant") == HOSTILE["tenant_id"]
        assert HOSTILE["last_error"] in page.inner_text("#last-error")
        assert "window.__pwned='payload'" in page.inner_text("#payload")
        assert "<script>alert('tb')</script>" in page.inner_text("#traceback")
        assert page.dialogs == []


def test_retrying_a_filtered_set_changes_exactly_what_its_dry_run_counted(db_url, conn, page):
    chosen = insert_runs(conn, 7, "send_email", status="dead", error_type="SMTPError")
    others = insert_runs(conn, 3, "send_email", status="dead", error_type="Bounce")
    insert_runs(conn, 2, "send_email", status="succeeded", error_type="SMTPError")
    with serving(dashboard(db_url, allow_actions=True)) as base:
        _log_in(page, base)
        page.goto(base + "/runs?status=dead&type=send_email&error_type=SMTPError")
        page.click("#retry-selection")
        assert page.inner_text("#dry-run-count") == "7"
        page.fill("#confirm-form input[name=reason]", "SMTP fixed")
        page.click("#confirm")
        assert page.inner_text("#audit tr.current td:nth-child(5)") == "7"
        assert page.inner_text("#flash").startswith("Retried the selected runs")
        selection = page.inner_text("#audit tr.current td:nth-child(6)")
        assert selection.startswith("status = dead, type = send_email, error type = SMTPError")

    retried = "SELECT id FROM job_runs WHERE status = 'queued' ORDER BY id"
    assert [r[0] for r in conn.execute(retried)] == chosen
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'dead'") == len(others)
    assert conn.execute("SELECT actor, command, changed, reason FROM job_audit").fetchall() == [
        ("operator-on-call", "retry", 7, "SMTP fixed")
    ]


def _post_from_the_page(page: Any, url: str, fields: dict[str, str]) -> int:
    """What a form the page submits gets back: its status."""
    with page.expect_navigation(url=url) as answer:
        page.evaluate(
            """([url, fields]) => {
                const form = document.createElement('form');
                form.method = 'post'; form.action = url;
                for (const [name, value] of Object.entries(fields)) {
                    const input = document.createElement('input');
                    input.type = 'hidden'; input.name = name; input.value = value;
                    form.appendChild(input);
                }
                document.body.appendChild(form); form.submit();
            }""",
            [url, fields],
        )
    return answer.value.status


def test_without_allow_actions_the_same_post_changes_nothing(db_url, conn, page):
    insert_runs(conn, 4, "send_email", status="dead")
    fields = {"command": "retry", "status": "dead", "type": "send_email"}
    with serving(dashboard(db_url)) as base, serving(_blank_page()) as other:
        page.goto(other + "/")
        status = _post_from_the_page(page, base + "/actions/runs", fields)
        page.goto(base + "/runs?status=dead")
        assert page.locator("#selection-actions, form[method=post]").count() == 0
    assert status == 405
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'dead'") == 4
    assert count(conn, "SELECT count(*) FROM job_audit") == 0


def test_a_cross_site_post_is_refused(db_url, conn, page):
    [run_id] = insert_runs(conn, 1, "send_email", status="dead")
    with serving(dashboard(db_url, allow_actions=True)) as base, serving(_blank_page()) as evil:
        _log_in(page, base)
        page.goto(f"{base}/runs/{run_id}")  # the operator's browser holds the form token
        token = page.get_attribute("#run-actions input[name=csrf_token]", "value")
        page.goto(evil + "/")
        status = _post_from_the_page(
            page, f"{base}/actions/runs/{run_id}", {"command": "retry", "csrf_token": token}
        )
        assert "cross-site request refused" in page.inner_text("body")
    assert status == 403
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'dead'") == 1
    assert count(conn, "SELECT count(*) FROM job_audit") == 0


def test_actions_need_the_login_link_jobrunner_web_printed(db_url, conn, page):
    [run_id] = insert_runs(conn, 1, "send_email", status="dead")
    with jobrunner_web(db_url, "--allow-actions", "--actor", "ann") as web:
        page.goto(f"{web.base}/runs/{run_id}")
        assert "open the link jobrunner web printed" in page.inner_text("#login-needed")
        assert page.locator("form[method=post], #run-actions").count() == 0

        page.goto(web.login_link)
        assert page.url == web.base + "/"  # the token is not left in the address or history
        assert page.locator("#login-needed").count() == 0
        page.goto(f"{web.base}/runs/{run_id}")
        page.fill("#run-actions input[name=reason]", "SMTP fixed")
        page.click("#retry-run")
        assert page.inner_text("#flash") == f"Retried run {run_id}: it is due now."
        page.wait_for_function("() => !location.search.includes('done=')")
        assert page.url == f"{web.base}/runs/{run_id}"
        assert page.dialogs == []
    assert conn.execute("SELECT actor, command, reason FROM job_audit").fetchall() == [
        ("ann", "retry", "SMTP fixed")
    ]
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'queued'") == 1


def test_a_page_under_a_rebinding_name_gets_nothing_of_the_dashboard(db_url, conn, page):
    insert_run(conn, "send_email", status="dead", tenant_id="acme-secret-tenant")
    with jobrunner_web(db_url) as web:
        for path in ("/", "/runs?status=dead", "/healthz"):
            answer = page.goto(f"http://rebind.test:{web.port}{path}")
            assert answer.status == 400, path
            assert "unknown host" in page.inner_text("body")
            assert "acme-secret-tenant" not in page.content()
        page.goto(f"http://localhost:{web.port}/runs?status=dead")
        assert "acme-secret-tenant" in page.inner_text("#runs")


def test_a_runs_page_says_where_its_logs_and_traceback_are_when_hidden(db_url, conn, page):
    run_id = insert_run(conn, "billing.charge", status="dead", attempts=1)
    conn.execute(
        "INSERT INTO job_attempts (run_id, attempt, error_type, message, traceback)"
        " VALUES (%s, 1, 'CardError', 'declined', 'Traceback: card=4111111111111111')",
        (run_id,),
    )
    event = '{"level": "info", "event": "key sk_live_abc123", "timestamp": "2026-01-01T00:00:00Z"}'
    conn.execute(
        "INSERT INTO job_run_logs (run_id, attempt, outcome, events) VALUES (%s, 1, 'dead', %s)",
        (run_id, f"[{event}]"),
    )
    with jobrunner_web(db_url) as web:
        page.goto(f"{web.base}/runs/{run_id}")
        assert "--show-logs" in page.inner_text("#run-log-hidden")
        assert "--show-logs" in page.inner_text("#traceback-hidden")
        assert "declined" in page.inner_text("#attempts")
        content = page.content()
    assert "4111111111111111" not in content and "sk_live_abc123" not in content


def _blank_page() -> Any:
    """Another site: a page of its own origin (another port), with no policy of ours."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/html")],
            }
        )
        await send({"type": "http.response.body", "body": b"<!doctype html><body>other</body>"})

    return app
