"""The dashboard over real HTTP: what it refuses, who it lets in, the headers it always
sends, where it can be mounted, and the command line's doors to it (`jobrunner web`,
`jobrunner schedule run`). What a browser does with its pages is tests/test_web_browser.py's.
"""

from __future__ import annotations

import base64
import re

import pytest

from tests.conftest import count, run_cli
from tests.factories import insert_run, insert_runs
from tests.web_server import cookie_pair, request, serving

pytest.importorskip("starlette")

LOGIN_TOKEN = "a-login-token-for-the-tests"


def dashboard(db_url: str, **options):
    from cronjob.web import app

    return app(db_url, **options)


def _login(base: str) -> str:
    """The session cookie a browser gets from the login link."""
    answer = request(f"{base}/?token={LOGIN_TOKEN}")
    assert answer.status == 303 and answer.headers["location"] == "/"
    return cookie_pair(answer, "jobrunner_session")


def _token(base: str, path: str = "/runs/1", session: str = "") -> tuple[str, str]:
    """A page's form token and the cookies that go with it (the session's too), as a
    browser would hold them."""
    answer = request(base + path, headers={"Cookie": session} if session else {})
    cookie = cookie_pair(answer, "jobrunner_csrf")
    token = re.search(r'name="csrf_token" value="([^"]+)"', answer.body).group(1)
    return token, "; ".join(filter(None, [cookie, session]))


def test_every_answer_carries_the_security_headers_not_found_and_refusals_too(db_url):
    with serving(dashboard(db_url)) as base:
        answers = [
            request(base + "/"),
            request(base + "/runs/424242"),
            request(base + "/nowhere"),
            request(base + "/actions/runs", method="POST", form={}),
        ]
    assert [a.status for a in answers] == [200, 404, 404, 405]
    for answer in answers:
        policy = answer.headers["content-security-policy"]
        assert "default-src 'none'" in policy
        # Scripts from the dashboard itself only: no inline script, no other source.
        [scripts] = [d.strip() for d in policy.split(";") if d.strip().startswith("script-src")]
        assert scripts == "script-src 'self'"
        assert "frame-ancestors 'none'" in policy and "form-action 'self'" in policy
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "same-origin"


def test_read_only_refuses_every_state_changing_method_and_changes_nothing(db_url, conn):
    [run_id] = insert_runs(conn, 1, "mail", status="dead")
    with serving(dashboard(db_url)) as base:
        answers = [
            request(f"{base}{path}", method=method, form={"command": "retry", "status": "dead"})
            for path in ("/actions/runs", f"/actions/runs/{run_id}", "/runs", "/")
            for method in ("POST", "PUT", "DELETE")
        ]
        confirm = request(f"{base}/actions/confirm?command=retry&status=dead")
    assert {a.status for a in answers} == {405}
    assert confirm.status == 404
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'dead'") == 1
    assert count(conn, "SELECT count(*) FROM job_audit") == 0


def test_a_post_without_this_browsers_form_token_is_refused(db_url, conn):
    [run_id] = insert_runs(conn, 1, "mail", status="dead")
    with serving(dashboard(db_url, allow_actions=True, login_token=LOGIN_TOKEN)) as base:
        session = _login(base)
        token, cookie = _token(base, f"/runs/{run_id}", session)
        other, _ = _token(base, f"/runs/{run_id}", session)
        url = f"{base}/actions/runs/{run_id}"
        refused = [
            request(url, method="POST", form={"command": "retry"}, headers={"Cookie": cookie}),
            request(
                url,
                method="POST",
                form={"command": "retry", "csrf_token": token},
                headers={"Cookie": session},
            ),
            request(
                url,
                method="POST",
                form={"command": "retry", "csrf_token": other},
                headers={"Cookie": cookie},
            ),
            request(
                url,
                method="POST",
                form={"command": "retry", "csrf_token": token},
                headers={"Cookie": cookie, "Origin": "http://evil.example"},
            ),
            request(
                url,
                method="POST",
                form={"command": "retry", "csrf_token": token},
                headers={"Cookie": cookie, "Sec-Fetch-Site": "cross-site"},
            ),
        ]
        assert [a.status for a in refused] == [403] * 5
        assert count(conn, "SELECT count(*) FROM job_audit") == 0
        done = request(
            url,
            method="POST",
            form={"command": "retry", "csrf_token": token},
            headers={"Cookie": cookie, "Origin": base},
        )
    assert done.status == 303 and done.headers["location"] == f"/runs/{run_id}?done=retried-run"
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'queued'") == 1
    assert count(conn, "SELECT count(*) FROM job_audit WHERE command = 'retry'") == 1


def test_basic_authentication_lets_in_its_user_alone_and_records_them_as_the_actor(db_url, conn):
    insert_run(conn, "mail", status="queued")

    def auth(credentials: str) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()}

    app = dashboard(db_url, allow_actions=True, basic_auth="alice:s3cret", actor="nobody")
    with serving(app) as base:
        assert request(base + "/").status == 401
        assert request(base + "/", headers=auth("alice:wrong")).status == 401
        assert request(base + "/healthz", headers=auth("bob:s3cret")).status == 401
        page = request(base + "/", headers=auth("alice:s3cret"))
        assert page.status == 200
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.body).group(1)
        cookie = cookie_pair(page, "jobrunner_csrf")
        paused = request(
            base + "/actions/types",
            method="POST",
            form={"command": "pause", "job_type": "mail", "csrf_token": token},
            headers={**auth("alice:s3cret"), "Cookie": cookie},
        )
    assert paused.status == 303
    assert conn.execute("SELECT actor, command FROM job_audit").fetchall() == [("alice", "pause")]
    assert conn.execute("SELECT paused_by FROM job_type_pauses").fetchall() == [("alice",)]


def test_mounted_under_a_prefix_its_links_keep_the_prefix_and_the_hosts_user_acts(db_url, conn):
    from starlette.applications import Starlette
    from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
    from starlette.middleware import Middleware
    from starlette.middleware.authentication import AuthenticationMiddleware
    from starlette.routing import Mount

    class HostLogin(AuthenticationBackend):
        async def authenticate(self, conn):
            return AuthCredentials(["authenticated"]), SimpleUser("carol")

    [run_id] = insert_runs(conn, 1, "mail", status="dead")
    host = Starlette(
        routes=[Mount("/ops/jobs", app=dashboard(db_url, allow_actions=True))],
        middleware=[Middleware(AuthenticationMiddleware, backend=HostLogin())],
    )
    with serving(host) as base:
        page = request(f"{base}/ops/jobs/runs/{run_id}")
        assert page.status == 200
        assert 'href="/ops/jobs/static/dashboard.css"' in page.body
        assert f'action="/ops/jobs/actions/runs/{run_id}"' in page.body
        token, cookie = _token(base, f"/ops/jobs/runs/{run_id}")
        done = request(
            f"{base}/ops/jobs/actions/runs/{run_id}",
            method="POST",
            form={"command": "retry", "csrf_token": token},
            headers={"Cookie": cookie},
        )
    assert (
        done.status == 303
        and done.headers["location"] == f"/ops/jobs/runs/{run_id}?done=retried-run"
    )
    assert conn.execute("SELECT actor FROM job_audit").fetchall() == [("carol",)]


def _host_app(db_url: str, user: str | None, **options):
    """The dashboard mounted at /ops/jobs in an application whose authentication middleware
    lets in `user`, or, with None, an anonymous visitor (Starlette's UnauthenticatedUser)."""
    from starlette.applications import Starlette
    from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
    from starlette.middleware import Middleware
    from starlette.middleware.authentication import AuthenticationMiddleware
    from starlette.routing import Mount

    class HostLogin(AuthenticationBackend):
        async def authenticate(self, conn):
            if user is None:
                return None
            return AuthCredentials(["authenticated"]), SimpleUser(user)

    return Starlette(
        routes=[Mount("/ops/jobs", app=dashboard(db_url, **options))],
        middleware=[Middleware(AuthenticationMiddleware, backend=HostLogin())],
    )


def test_mounted_an_anonymous_user_of_the_host_application_is_refused_every_page(db_url, conn):
    [run_id] = insert_runs(conn, 1, "mail", status="dead", tenant_id="acme")
    with serving(_host_app(db_url, None, allow_actions=True)) as base:
        answers = [
            request(f"{base}/ops/jobs{path}") for path in ("/", f"/runs/{run_id}", "/healthz")
        ]
        posted = request(
            f"{base}/ops/jobs/actions/runs/{run_id}",
            method="POST",
            form={"command": "retry", "csrf_token": "x"},
        )
    for answer in [*answers, posted]:
        assert (answer.status, answer.body) == (403, "sign in to the application first\n")
    assert count(conn, "SELECT count(*) FROM job_audit") == 0


def test_mounted_without_a_known_user_actions_are_refused_and_no_button_shows(db_url, conn):
    from starlette.applications import Starlette
    from starlette.routing import Mount

    [run_id] = insert_runs(conn, 1, "mail", status="dead")
    host = Starlette(routes=[Mount("/ops/jobs", app=dashboard(db_url, allow_actions=True))])
    with serving(host) as base:
        page = request(f"{base}/ops/jobs/runs/{run_id}")
        posted = request(
            f"{base}/ops/jobs/actions/runs/{run_id}",
            method="POST",
            form={"command": "retry", "csrf_token": "x"},
        )
    assert page.status == 200 and 'name="csrf_token"' not in page.body
    assert "sign in to your application" in page.body
    assert posted.status == 403
    assert "actions need a known user" in posted.body
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'dead'") == 1
    assert count(conn, "SELECT count(*) FROM job_audit") == 0


def test_healthz_answers_the_queues_headline_numbers_as_json(db_url, conn):
    import json

    insert_run(conn, "mail", status="dead")
    insert_run(conn, "mail", run_at="2000-01-01T00:00:00Z")
    with serving(dashboard(db_url)) as base:
        answer = request(base + "/healthz")
    shown = json.loads(answer.body)
    assert answer.status == 200 and answer.headers["content-type"] == "application/json"
    assert shown["ok"] is True and shown["dead"] == 1 and shown["due"] == 1


def test_web_refuses_an_address_beyond_loopback_without_authentication(db_url):
    result = run_cli("web", "--database-url", db_url, "--host", "0.0.0.0")
    assert result.exit_code == 2
    assert "--basic-auth-env" in result.stderr and "--no-auth" in result.stderr


def test_web_refuses_a_basic_auth_variable_that_holds_no_user_and_password(db_url):
    result = run_cli(
        "web",
        "--database-url",
        db_url,
        "--basic-auth-env",
        "DASH_AUTH",
        env={"DASH_AUTH": "justapassword"},
    )
    assert result.exit_code == 2
    assert "DASH_AUTH" in result.stderr and "justapassword" not in result.stderr


def test_schedule_run_enqueues_one_occurrence_now_and_audits_it(db_url, conn):
    assert (
        run_cli(
            "schedule",
            "add",
            "nightly",
            "--cron",
            "0 3 * * *",
            "--type",
            "report",
            "--payload",
            '{"kind": "full"}',
            "--database-url",
            db_url,
        ).exit_code
        == 0
    )
    before = conn.execute("SELECT next_fire_at FROM job_definitions").fetchone()

    result = run_cli(
        "schedule",
        "run",
        "nightly",
        "--reason",
        "rerun after fix",
        "--actor",
        "dave",
        "--database-url",
        db_url,
    )

    assert result.exit_code == 0, result.stderr
    assert "1 run(s) enqueued" in result.stdout
    rows = conn.execute(
        "SELECT r.job_type, r.payload, r.status, r.scheduled_for <= now(), d.name"
        " FROM job_runs r JOIN job_definitions d ON d.id = r.definition_id"
    ).fetchall()
    assert rows == [("report", {"kind": "full"}, "queued", True, "nightly")]
    assert conn.execute("SELECT next_fire_at FROM job_definitions").fetchone() == before
    audited = "SELECT actor, command, changed, reason FROM job_audit WHERE command = 'schedule run'"
    assert conn.execute(audited).fetchall() == [("dave", "schedule run", 1, "rerun after fix")]


def test_schedule_run_of_an_unknown_schedule_is_exit_1_and_writes_nothing(db_url, conn):
    result = run_cli("schedule", "run", "nope", "--database-url", db_url)
    assert result.exit_code == 1 and "not found" in result.stderr
    assert count(conn, "SELECT count(*) FROM job_audit") == 0


def test_commands_but_web_import_nothing_of_the_dashboard_or_its_libraries(db_url):
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from cronjob.cli import main\n"
        "try:\n"
        f"    main(['status', '--database-url', {db_url!r}])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('starlette', 'jinja2', 'uvicorn', 'playwright') or m.startswith('cronjob.web')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_runs_page_shows_what_each_attempt_logged_as_show_prints_it_when_shown(db_url, conn):
    run_id = insert_run(conn, "test.chatty", attempts=1)  # a log is kept for an attempt made
    conn.execute(
        "INSERT INTO job_run_logs (run_id, attempt, worker, outcome, events, trimmed)"
        " VALUES (%s, 1, 'host:7', 'failed', %s, 3)",
        [
            run_id,
            '[{"timestamp": "2026-11-26T10:00:00.123456Z", "level": "warning",'
            ' "event": "<script>alert(1)</script> slow", "run_id": 1, "bank": "acme",'
            ' "exception": "Traceback:\\n  boom"}, "not an object"]',
        ],
    )
    with serving(dashboard(db_url, show_logs=True)) as base:
        page = request(f"{base}/runs/{run_id}").body
    logged = page.split('id="run-log-1">', 1)[1].split("</pre>", 1)[0]
    assert logged.splitlines() == [
        "10:00:00.123  warning  &lt;script&gt;alert(1)&lt;/script&gt; slow  bank=acme",
        "    Traceback:",
        "      boom",
    ]
    assert "Attempt #1 <small>failed, worker host:7" in page
    assert "3 earlier events not kept." in page


class _Recorded:
    """The statements a connection ran, with their parameters (its cursors record them)."""

    statements: list = []

    @classmethod
    def cursor_class(cls):
        import psycopg

        class Recording(psycopg.Cursor):
            def execute(self, query, params=None, **kwargs):
                cls.statements.append((query, params))
                return super().execute(query, params, **kwargs)

        return Recording


def _rows_read(plan: dict) -> int:
    """Rows the scans of an EXPLAIN ANALYZE plan read: those they kept and those they threw
    away, every loop of each."""
    read = 0
    if "Scan" in plan["Node Type"]:
        kept = plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)
        read += int((kept + plan.get("Rows Removed by Index Recheck", 0)) * plan["Actual Loops"])
    return read + sum(_rows_read(child) for child in plan.get("Plans", []))


@pytest.mark.parametrize(
    "filters",
    [
        {"status": "queued", "type": "hog"},
        {"status": "queued,failed", "tenant": "acme"},
        {"status": "queued,running", "type": "hog", "tenant": "acme"},
        {"status": "queued"},
    ],
)
def test_a_page_of_waiting_runs_reads_a_window_however_long_the_backlog(db_url, filters):
    import json

    import psycopg

    from cronjob import store
    from cronjob.web import pages

    backlog = 100_000
    with psycopg.connect(db_url, autocommit=True) as conn:
        insert_runs(conn, 50_000, "done", status="succeeded", tenant_id="acme")
        insert_runs(conn, backlog, "hog", tenant_id="acme")
        insert_runs(conn, 10, "hog", status="running", tenant_id="acme")
        conn.execute("ANALYZE job_runs")
        conn.cursor_factory = _Recorded.cursor_class()
        _Recorded.statements.clear()
        selection = pages.run_selection(conn, filters)
        page = store.runs_list_page(
            conn,
            selection,
            before=None,
            limit=pages.PAGE_SIZE,
            window=pages.run_window(selection),
        )
        query, params = _Recorded.statements[-1]
        [[plan]] = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}", params).fetchone()
    assert len(page.runs) == pages.PAGE_SIZE
    read = _rows_read(plan["Plan"])
    assert read <= pages.RUN_WINDOW + 100, json.dumps(plan, indent=1)
