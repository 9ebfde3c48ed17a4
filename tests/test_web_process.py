"""`jobrunner web` as a process of its own, over real HTTP. How its pages behave in a browser
is tests/test_web_browser.py's.
"""

from __future__ import annotations

import re

import pytest

from tests.factories import insert_runs
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
