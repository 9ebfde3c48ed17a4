"""The dashboard that keeps up, in Debian's headless Chromium (tests/test_web_browser.py's
browser): tabs, relative times, a page that refreshes itself until paused, a confirmation
after an action, reason boxes that fit their placeholder.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests import test_web_browser as shared
from tests.conftest import count
from tests.factories import insert_run, insert_runs
from tests.web_server import serving

pytest.importorskip("starlette")

# tests/test_web_browser.py's Chromium, tabs and helpers.
browser, page = shared.browser, shared.page
pytestmark = shared.pytestmark
dashboard, _log_in, _shoot = shared.dashboard, shared._log_in, shared._shoot


def _shown_ids(page: Any) -> list[int]:
    return [int(t) for t in page.locator("#runs tr.run td:first-child").all_inner_texts()]


def test_status_tabs_show_each_statuss_count_and_mark_the_one_shown(db_url, conn, page):
    dead = insert_runs(conn, 3, "send_email", status="dead", tenant_id="acme")
    insert_runs(conn, 4, "send_email", tenant_id="acme")
    insert_runs(conn, 2, "send_email", status="running", tenant_id="acme")
    insert_runs(conn, 5, "send_email", status="dead", tenant_id="globex")
    with serving(dashboard(db_url)) as base:
        page.goto(base + "/runs?tenant=acme")
        assert page.inner_text("#tab-all .n") == "9"
        assert page.inner_text("#tab-dead .n") == "3"
        assert page.inner_text("#tab-queued .n") == "4"
        assert page.get_attribute("#tab-all", "aria-current") == "page"
        page.click("#tab-dead")
        assert "tenant=acme" in page.url and "status=dead" in page.url
        assert page.get_attribute("#tab-dead", "aria-current") == "page"
        assert page.locator("#status-tabs [aria-current]").count() == 1
        assert _shown_ids(page) == sorted(dead, reverse=True)
        assert page.inner_text("#tab-dead .n") == "3"  # the tabs count whatever tab is shown


def test_times_say_how_long_ago_and_give_the_utc_time_on_hover(db_url, conn, page):
    run_id = insert_run(conn, "send_email", status="dead", finished_at="2026-01-05T09:01:35Z")
    with serving(dashboard(db_url)) as base:
        page.goto(f"{base}/runs?status=dead")
        shown = page.locator(f"#runs tr.run:has(a[href$='/runs/{run_id}']) time")
        assert shown.inner_text().endswith(" ago")
        assert shown.get_attribute("title") == "2026-01-05T09:01:35Z"
        assert shown.get_attribute("datetime") == "2026-01-05T09:01:35Z"


# The page's timer, driven by the test: the dashboard's script gets a setInterval that only
# records its callback, and `_refresh_due` calls it, as if the interval had passed. Injected
# by the browser's debugging protocol before any script of the page, not by the page.
DRIVEN_TIMER = """
window.__dueRefreshes = [];
window.setInterval = (callback) => { window.__dueRefreshes.push(callback); return 0; };
"""


def _refresh_due(page: Any, *, reloads: bool) -> None:
    """The refresh interval passes once; `reloads`: the page must reload for it."""
    due = "() => window.__dueRefreshes.forEach(callback => callback())"
    if reloads:
        with page.expect_navigation():
            page.evaluate(due)
        page.wait_for_load_state("load")
    else:
        page.evaluate(due)


def _skipped(page: Any) -> int:
    return int(page.get_attribute("body", "data-refresh-skipped") or 0)


def test_a_page_refreshes_itself_until_paused_and_stays_paused(db_url, conn, page):
    page.add_init_script(DRIVEN_TIMER)
    first = insert_run(conn, "send_email")
    with serving(dashboard(db_url, refresh_seconds=5)) as base:
        page.goto(base + "/runs")
        assert _shown_ids(page) == [first]
        assert page.inner_text("#refresh-toggle") == "Pause auto-refresh"
        enqueued = insert_run(conn, "send_email")
        _refresh_due(page, reloads=True)
        assert _shown_ids(page) == [enqueued, first]

        page.click("#refresh-toggle")
        assert page.inner_text("#refresh-toggle") == "Resume auto-refresh"
        page.evaluate("() => { window.stillThisPage = true; }")
        unseen = insert_run(conn, "send_email")
        for _ in range(3):
            _refresh_due(page, reloads=False)
        assert _skipped(page) == 3
        assert page.evaluate("() => window.stillThisPage") is True
        assert unseen not in _shown_ids(page)

        page.goto(base + "/")  # paused on every page of the dashboard, until resumed
        assert page.get_attribute("body", "data-refresh-state") == "paused"
        page.goto(base + "/runs")
        page.click("#refresh-toggle")
        assert page.get_attribute("body", "data-refresh-state") == "on"
        _refresh_due(page, reloads=True)
        assert _shown_ids(page)[0] == unseen
        assert page.dialogs == []


def test_a_page_does_not_refresh_away_what_is_being_typed(db_url, conn, page):
    page.add_init_script(DRIVEN_TIMER)
    [run_id] = insert_runs(conn, 1, "send_email", status="dead")
    with serving(dashboard(db_url, refresh_seconds=5, allow_actions=True)) as base:
        _log_in(page, base)
        page.goto(f"{base}/runs/{run_id}")
        page.fill("#run-actions input[name=reason]", "SMTP fixed")
        _refresh_due(page, reloads=False)  # typing
        page.locator("#run-actions input[name=reason]").blur()
        _refresh_due(page, reloads=False)  # typed, not sent
        assert _skipped(page) == 2
        assert page.input_value("#run-actions input[name=reason]") == "SMTP fixed"


def test_an_action_says_what_it_did_once_and_the_retried_run_shows_no_old_error(db_url, conn, page):
    run_id = insert_run(conn, "send_email", status="dead", attempts=1, last_error="SMTP down")
    conn.execute(
        "INSERT INTO job_attempts (run_id, attempt, error_type, message)"
        " VALUES (%s, 1, 'SMTPError', 'SMTP down')",
        (run_id,),
    )
    with serving(dashboard(db_url, allow_actions=True)) as base:
        _log_in(page, base)
        page.goto(f"{base}/runs/{run_id}")
        assert "SMTP down" in page.inner_text("#last-error")
        page.fill("#run-actions input[name=reason]", "SMTP fixed")
        page.click("#retry-run")
        assert page.inner_text("#flash") == f"Retried run {run_id}: it is due now."
        assert "SMTP down" not in page.inner_text("#last-error")
        assert "SMTP down" in page.inner_text("#attempts")
        page.wait_for_function("() => !location.search.includes('done=')")
        page.reload()
        assert page.locator("#flash").count() == 0  # said once, not at every refresh
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'queued'") == 1


def test_reason_boxes_are_wide_enough_for_their_placeholder(db_url, conn, page):
    [run_id] = insert_runs(conn, 1, "send_email", status="dead")
    with serving(dashboard(db_url, allow_actions=True)) as base:
        _log_in(page, base)
        for path in (f"/runs/{run_id}", "/"):
            page.goto(base + path)
            boxes = page.locator("input[name=reason]")
            assert boxes.count() >= 1, path
            for box in boxes.all():
                room, needed = box.evaluate(
                    """input => {
                        const s = getComputedStyle(input);
                        const canvas = document.createElement('canvas').getContext('2d');
                        canvas.font = `${s.fontWeight} ${s.fontSize} ${s.fontFamily}`;
                        const padding = parseFloat(s.paddingLeft) + parseFloat(s.paddingRight);
                        const text = canvas.measureText(input.placeholder).width;
                        return [input.clientWidth - padding, text];
                    }"""
                )
                assert room >= needed, (path, room, needed)


def test_the_overview_shows_recent_ticks_and_a_burst_on_a_labelled_log_scale(db_url, conn, page):
    from psycopg import sql

    import tests.handlers.basic  # noqa: F401 - registers test.ok
    from tests.factories import tick

    minutes = sql.SQL("now() - make_interval(mins => 2 + i % 60)")
    insert_runs(conn, 120, "send_email", status="succeeded", finished_at=minutes)
    insert_runs(conn, 1000, "send_email", status="succeeded", finished_at=sql.SQL("now()"))
    insert_runs(conn, 2, "test.ok")
    tick(db_url, "test.ok")
    with serving(dashboard(db_url)) as base:
        page.goto(base + "/")
        assert page.is_visible("#finished-scale")
        assert "log scale" in page.inner_text("#finished-scale")
        assert page.locator("svg.chart path.grid").count() == 3
        row = page.inner_text("#ticks tr.tick")
        assert "claimed 2: 2 succeeded, 0 failed, 0 dead" in row
        assert page.get_attribute("#ticks tr.tick time", "title").endswith("Z")


def test_a_refresh_keeps_where_the_page_was_scrolled_to(db_url, conn, page):
    page.add_init_script(DRIVEN_TIMER)
    insert_runs(conn, 50, "send_email", status="dead")
    with serving(dashboard(db_url, refresh_seconds=5)) as base:
        page.goto(base + "/runs")
        page.evaluate("() => window.scrollTo(0, 600)")
        _refresh_due(page, reloads=True)
        page.wait_for_function("() => window.scrollY === 600")
