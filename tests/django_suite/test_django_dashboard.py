"""The dashboard mounted in a Django project's asgi.py, as docs/guides/dashboard.md shows: the
project's own pages and the dashboard's, served together by uvicorn, the dashboard behind its basic
authentication, its links under the prefix it is mounted at."""

from __future__ import annotations

import base64
import importlib

import pytest

from tests.factories import insert_run
from tests.web_server import request, serving

AUTH = "ops:s3cret-for-tests"
HEADERS = {"Authorization": "Basic " + base64.b64encode(AUTH.encode()).decode()}


@pytest.fixture
def asgi(project: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("JOBRUNNER_WEB_AUTH", AUTH)
    import project.asgi

    return importlib.reload(project.asgi).application


def test_a_django_project_serves_the_dashboard_under_its_prefix_and_its_own_pages_beside(
    project: str, asgi
) -> None:
    import psycopg

    with psycopg.connect(project, autocommit=True) as conn:
        run_id = insert_run(conn, "shop.report", status="dead", attempts=1)

    with serving(asgi) as base:
        overview = request(f"{base}/jobs/", headers=HEADERS)
        run = request(f"{base}/jobs/runs/{run_id}", headers=HEADERS)
        anonymous = request(f"{base}/jobs/runs/{run_id}")
        django_page = request(f"{base}/hello/")

    assert overview.status == 200
    assert 'href="/jobs/runs' in overview.body
    assert run.status == 200 and "shop.report" in run.body
    assert anonymous.status == 401
    assert (django_page.status, django_page.body) == (200, "hello from django")
