"""`jobrunner web` as a process of its own, over real HTTP: pages of waiting runs, and bad
filters. How its pages behave in a browser is tests/test_web_browser.py's.
"""

from __future__ import annotations

import re

import pytest

from tests.factories import insert_run, insert_runs
from tests.web_server import jobrunner_web, request

pytest.importorskip("starlette")


# -- pages of waiting runs ------------------------------------------------------------------


def test_a_page_of_waiting_runs_of_a_type_searches_a_window_of_ids_not_the_backlog(db_url, conn):
    from cronjob.web.pages import PAGE_SIZE, RUN_WINDOW

    backlog = insert_runs(conn, RUN_WINDOW + 5_000, "hog", tenant_id="acme")
    with jobrunner_web(db_url) as web:
        first = request(f"{web.base}/runs?status=queued&type=hog")
        older = re.search(r'href="([^"]+)" id="older"', first.body).group(1)
        second = request(web.base + older.replace("&amp;", "&"))
    shown = [int(i) for i in re.findall(r'<a href="/runs/(\d+)">', first.body)]
    assert shown == sorted(backlog, reverse=True)[:PAGE_SIZE]
    assert f"searches {RUN_WINDOW:,} ids a page" in first.body
    assert f"before={shown[-1]}" in older
    again = [int(i) for i in re.findall(r'<a href="/runs/(\d+)">', second.body)]
    assert again == sorted(backlog, reverse=True)[PAGE_SIZE : 2 * PAGE_SIZE]


# -- bad filters ----------------------------------------------------------------------------


def test_a_nul_in_a_filter_or_a_name_is_a_400_saying_so(db_url, conn):
    insert_run(conn, "mail", status="dead")
    with jobrunner_web(db_url) as web:
        answers = {
            path: request(web.base + path)
            for path in (
                "/runs?type=mail%00x",
                "/runs?tenant=%00",
                "/runs?status=queued&tenant=a%00",
                "/runs?error_type=x%00",
                "/runs?schedule=nightly%00",
                "/runs?status=dead%00",
                "/runs?since=1h%00",
                "/schedules/nightly%00",
            )
        }
        after = request(web.base + "/healthz")
    for path, answer in answers.items():
        assert answer.status == 400, path
        assert "contains a NUL character" in answer.body, path
    assert "invalid type: contains a NUL character" in answers["/runs?type=mail%00x"].body
    assert after.status == 200
