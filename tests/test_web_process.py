"""`jobrunner web` as a process of its own, over real HTTP: the names it answers to (a DNS
rebinding page gets nothing), the login every action needs, however local the account, the
throttle on guessed passwords, cookies behind a TLS proxy, what a run's page hides unless
asked, and bad filters. How its pages behave in a browser is tests/test_web_browser.py's.
"""

from __future__ import annotations

import base64
import json
import re

import pytest

from tests.conftest import count, run_cli
from tests.factories import insert_run, insert_runs
from tests.web_server import cookie_pair, form_token, jobrunner_web, request

pytest.importorskip("starlette")

AUTH = "ops:correct-horse-battery"


def _basic(credentials: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()}


def _retry(web, run_id: int, cookies: str, token: str, **headers: str):
    return request(
        f"{web.base}/actions/runs/{run_id}",
        method="POST",
        form={"command": "retry", "csrf_token": token},
        headers={"Cookie": cookies, **headers},
    )


# -- the names it answers to ----------------------------------------------------------------


REFUSED_HOST = (
    "unknown host: this dashboard answers to its own names only"
    " (jobrunner web --allowed-host NAME adds one)\n"
)


def test_a_foreign_host_is_refused_before_anything_and_its_post_changes_nothing(db_url, conn):
    [run_id] = insert_runs(conn, 1, "mail", status="dead", tenant_id="acme")
    with jobrunner_web(db_url, "--allow-actions") as web:
        rebound = {"Host": f"rebind.example:{web.port}"}
        for path in ("/", f"/runs/{run_id}", "/healthz", "/audit", "/static/dashboard.css"):
            answer = request(f"{web.base}{path}", headers=rebound)
            assert (answer.status, answer.body) == (400, REFUSED_HOST), path
        # Even with every cookie and token the operator's browser holds (which a rebinding
        # page could not read), and the rebinding page's own origin as the Origin.
        session = web.login()
        page = request(f"{web.base}/runs/{run_id}", headers={"Cookie": session})
        cookies = f"{session}; {cookie_pair(page, 'jobrunner_csrf')}"
        posted = _retry(
            web,
            run_id,
            cookies,
            form_token(page),
            Host=f"rebind.example:{web.port}",
            Origin=f"http://rebind.example:{web.port}",
        )
    assert (posted.status, posted.body) == (400, REFUSED_HOST)
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'dead'") == 1
    assert count(conn, "SELECT count(*) FROM job_audit") == 0


def test_it_answers_to_its_loopback_names_with_its_port_and_to_each_allowed_host(db_url):
    with jobrunner_web(
        db_url,
        "--allowed-host",
        "jobs.example.com",
        "--allowed-host",
        "ops.example.com:8443",
        env={"JOBRUNNER_WEB_ALLOWED_HOSTS": "dash.internal,other.internal"},
    ) as web:

        def status(host: str) -> int:
            return request(f"{web.base}/healthz", headers={"Host": host}).status

        port = web.port
        assert status(f"127.0.0.1:{port}") == 200
        assert status(f"localhost:{port}") == 200
        assert status(f"LOCALHOST:{port}") == 200
        assert status(f"[::1]:{port}") == 200
        assert status("jobs.example.com") == 200  # any port: what a proxy in front sends
        assert status(f"jobs.example.com:{port}") == 200
        assert status("ops.example.com:8443") == 200
        assert status("ops.example.com") == 400  # port 80: not the one allowed
        assert status("localhost") == 400  # port 80 is not the dashboard's
        assert status(f"localhost:{port + 1}") == 400
        assert status(f"jobs.example.com.evil.test:{port}") == 400
        assert status("") == 400
    with jobrunner_web(db_url, env={"JOBRUNNER_WEB_ALLOWED_HOSTS": "dash.internal"}) as web:
        assert request(web.base + "/healthz", headers={"Host": "dash.internal"}).status == 200


def test_a_form_posted_from_another_of_its_own_names_is_accepted_and_from_a_port_not(db_url, conn):
    [first, second] = insert_runs(conn, 2, "mail", status="dead")
    with jobrunner_web(db_url, "--allow-actions", "--allowed-host", "jobs.example.com") as web:
        session = web.login()
        page = request(f"{web.base}/runs/{first}", headers={"Cookie": session})
        cookies = f"{session}; {cookie_pair(page, 'jobrunner_csrf')}"
        token = form_token(page)
        other_port = _retry(web, first, cookies, token, Origin=f"http://localhost:{web.port + 1}")
        proxied = _retry(web, first, cookies, token, Origin="https://jobs.example.com")
        local = _retry(web, second, cookies, token, Origin=f"http://localhost:{web.port}")
    assert other_port.status == 403 and "cross-site" in other_port.body
    assert proxied.status == 303 and local.status == 303
    assert count(conn, "SELECT count(*) FROM job_audit WHERE command = 'retry'") == 2


def test_web_refuses_an_allowed_host_that_is_no_host_name(db_url):
    result = run_cli("web", "--database-url", db_url, "--allowed-host", "evil.example/x")
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert "--allowed-host" in line and "evil.example/x" in line


# -- the login actions need -----------------------------------------------------------------


def test_on_loopback_a_browser_without_the_login_link_reads_but_cannot_act(db_url, conn):
    [run_id] = insert_runs(conn, 1, "mail", status="dead")
    with jobrunner_web(db_url, "--allow-actions", "--actor", "ann") as web:
        # Any local account reaches loopback: it reads the page, and tries what a form would.
        page = request(f"{web.base}/runs/{run_id}")
        found = re.search(r'name="csrf_token" value="([^"]+)"', page.body)
        cookies = "; ".join(c.split(";")[0] for c in page.cookies)
        posted = _retry(web, run_id, cookies, found.group(1) if found else "")
        paused = request(
            f"{web.base}/actions/types",
            method="POST",
            form={"command": "pause", "job_type": "mail"},
            headers={"Cookie": cookies},
        )
        confirm = request(f"{web.base}/actions/confirm?command=retry&status=dead")
        wrong = request(f"{web.base}/?token=guessed-{'x' * 40}")
    assert page.status == 200 and found is None and page.cookies == []
    assert "read-only until you log in" in page.body and '<form method="post"' not in page.body
    for refused in (posted, paused, confirm):
        assert refused.status == 403
        assert "actions need a login: open the link jobrunner web printed" in refused.body
    assert wrong.status == 403 and wrong.cookies == []
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'dead'") == 1
    assert (
        count(conn, "SELECT count(*) FROM job_audit")
        + count(conn, "SELECT count(*) FROM job_type_pauses")
        == 0
    )


def test_the_login_link_gives_a_session_that_acts_audited_as_who_started_it(db_url, conn):
    [run_id] = insert_runs(conn, 1, "mail", status="dead")
    with jobrunner_web(db_url, "--allow-actions", "--actor", "ann") as web:
        link = web.login_link
        opened = request(link)
        session = cookie_pair(opened, "jobrunner_session")
        page = request(f"{web.base}/runs/{run_id}", headers={"Cookie": session})
        cookies = f"{session}; {cookie_pair(page, 'jobrunner_csrf')}"
        done = _retry(web, run_id, cookies, form_token(page))
        deep = request(f"{web.base}/runs?status=dead&token={link.split('=', 1)[1]}")
    assert re.fullmatch(rf"http://127\.0\.0\.1:{web.port}/\?token=[\w-]{{40,}}", link)
    assert opened.status == 303 and opened.headers["location"] == "/"
    [cookie] = opened.cookies
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" not in cookie
    assert deep.status == 303 and deep.headers["location"] == "/runs?status=dead"
    assert done.status == 303
    assert conn.execute("SELECT actor, command FROM job_audit").fetchall() == [("ann", "retry")]
    # The token is a secret: printed on stdout alone, never in the log (access log included).
    token = link.split("=", 1)[1]
    log = "".join(web.stderr)
    assert token not in log and "token=***" in log
    assert '"login": "the link printed on stdout"' in log


def test_with_basic_authentication_no_link_is_printed_and_its_user_is_audited(db_url, conn):
    [run_id] = insert_runs(conn, 1, "mail", status="dead")
    with jobrunner_web(
        db_url, "--allow-actions", "--basic-auth-env", "DASH_AUTH", env={"DASH_AUTH": AUTH}
    ) as web:
        page = request(f"{web.base}/runs/{run_id}", headers=_basic(AUTH))
        cookies = cookie_pair(page, "jobrunner_csrf")
        done = request(
            f"{web.base}/actions/runs/{run_id}",
            method="POST",
            form={"command": "retry", "csrf_token": form_token(page)},
            headers={"Cookie": cookies, **_basic(AUTH)},
        )
    assert web.login_link is None and "".join(web.stdout) == ""
    assert done.status == 303
    assert conn.execute("SELECT actor FROM job_audit").fetchall() == [("ops",)]


# -- basic authentication's throttle --------------------------------------------------------


def test_ten_wrong_passwords_from_an_address_make_it_wait_even_with_the_right_one(db_url):
    with jobrunner_web(db_url, "--basic-auth-env", "DASH_AUTH", env={"DASH_AUTH": AUTH}) as web:
        url = f"{web.base}/"
        without = [request(url).status for _ in range(12)]  # a browser's first request
        guesses = [request(url, headers=_basic(f"ops:guess-{i}")).status for i in range(10)]
        throttled = request(url, headers=_basic(AUTH))
        elsewhere = request(url, headers=_basic(AUTH), source="127.0.0.2")
    assert without == [401] * 12
    assert guesses == [401] * 10
    assert throttled.status == 429
    assert 0 < int(throttled.headers["retry-after"]) <= 300
    assert "too many failed logins" in throttled.body
    assert elsewhere.status == 200


def test_the_throttle_lets_an_address_try_again_once_its_failures_are_old():
    from cronjob.web.guard import Throttle

    now = [1000.0]
    throttle = Throttle(most=3, window=60.0, clock=lambda: now[0])
    for _ in range(3):
        assert throttle.wait("10.0.0.1") == 0
        throttle.failed("10.0.0.1")
        now[0] += 10
    assert throttle.wait("10.0.0.1") == 30  # the first failure, at 1000, ages out at 1060
    assert throttle.wait("10.0.0.2") == 0
    now[0] = 1060.0
    assert throttle.wait("10.0.0.1") == 0
    throttle.failed("10.0.0.1")
    assert throttle.wait("10.0.0.1") == 10


def test_the_throttle_forgets_the_quietest_address_beyond_those_it_tracks():
    from cronjob.web.guard import Throttle

    throttle = Throttle(most=1, window=60.0, clock=lambda: 0.0, tracked=2)
    for client in ("a", "b", "c"):
        throttle.failed(client)
    assert [throttle.wait(c) for c in ("a", "b", "c")] == [0, 60, 60]


# -- cookies behind a TLS proxy -------------------------------------------------------------


def test_behind_a_tls_proxy_it_trusts_the_cookies_are_secure(db_url):
    https = {"X-Forwarded-Proto": "https"}
    with jobrunner_web(db_url, "--allow-actions", "--forwarded-allow-ips", "127.0.0.1") as web:
        opened = request(web.login_link, headers=https)
        session = cookie_pair(opened, "jobrunner_session")
        secure = request(f"{web.base}/", headers={"Cookie": session, **https})
        plain = request(f"{web.base}/", headers={"Cookie": session})
    [session_cookie] = opened.cookies
    [csrf_cookie] = secure.cookies
    [plain_cookie] = plain.cookies
    assert "; Secure" in session_cookie and "; Secure" in csrf_cookie
    assert "Secure" not in plain_cookie


def test_without_forwarded_allow_ips_a_forwarded_proto_is_not_believed(db_url):
    with jobrunner_web(db_url, "--allow-actions") as web:
        opened = request(web.login_link, headers={"X-Forwarded-Proto": "https"})
    [cookie] = opened.cookies
    assert "Secure" not in cookie


# -- what a run's page shows ----------------------------------------------------------------

SECRETS = ("4111 1111 1111 1111", "sk_live_51Hx9TESTKEYabcdef")


def _a_run_that_logged_secrets(conn) -> int:
    run_id = insert_run(conn, "billing.charge", status="failed", attempts=1)
    event = {
        "timestamp": "2026-11-26T10:00:00.123456Z",
        "level": "info",
        "event": f"charging card {SECRETS[0]}",
        "stripe_key": SECRETS[1],
    }
    conn.execute(
        "INSERT INTO job_run_logs (run_id, attempt, worker, outcome, events)"
        " VALUES (%s, 1, 'host:7', 'failed', %s)",
        [run_id, json.dumps([event])],
    )
    conn.execute(
        "INSERT INTO job_attempts (run_id, attempt, error_type, message, traceback)"
        " VALUES (%s, 1, 'CardError', 'declined', %s)",
        [run_id, f"Traceback:\n  charge(card='{SECRETS[0]}', key='{SECRETS[1]}')\nCardError"],
    )
    return run_id


def test_a_runs_page_hides_what_its_handler_logged_and_its_traceback_unless_asked(db_url, conn):
    run_id = _a_run_that_logged_secrets(conn)
    with jobrunner_web(db_url) as web:
        hidden = request(f"{web.base}/runs/{run_id}").body
    for secret in SECRETS:
        assert secret not in hidden
    assert 'id="run-log-hidden"' in hidden and 'id="traceback-hidden"' in hidden
    assert "started with --show-logs" in hidden
    assert "CardError" in hidden and "declined" in hidden  # the error itself still shows
    with jobrunner_web(db_url, "--show-logs") as web:
        shown = request(f"{web.base}/runs/{run_id}").body
    for secret in SECRETS:
        assert secret in shown


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
