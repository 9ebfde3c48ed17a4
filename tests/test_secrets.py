"""The database password never reaches output, logs or stored text, however it is written."""

from __future__ import annotations

import json
import random
import re
import time
from urllib.parse import quote

import pytest
from psycopg import conninfo

from cronjob.text import redact, remember_password
from tests.conftest import jobrunner_process, run_cli

HANDLERS = "tests.handlers.leaky"


def _passwords() -> list[str]:
    """Passwords with the characters that break careless quoting: made of words long
    enough that any piece of one showing up in output is a leak, not a coincidence."""
    rng = random.Random(21)
    odd = ["%", " ", "'", '"', "é", "日本", "\\", "%zz", "ü ", "'; "]
    found = []
    for _ in range(6):
        words = ["".join(rng.choices("QWXZJKVqwxzjkv", k=7)) for _ in range(3)]
        found.append(rng.choice(odd).join(words[:2]) + rng.choice(odd) + words[2])
    return found


PASSWORDS = _passwords()


def _words(password: str) -> list[str]:
    return [w for w in password.replace("%", " ").replace("'", " ").split() if len(w) >= 5]


def _assert_absent(password: str, *texts: str) -> None:
    for text in texts:
        assert password not in text
        for word in _words(password):
            assert word not in text, (word, text)


def _bad_urls(password: str) -> list[str]:
    escaped = password.replace("\\", "\\\\").replace("'", "\\'")
    return [
        f"postgresql://app:{password}@127.0.0.1:1/app",
        f"postgres://app:{password}@127.0.0.1:1/app?sslmode=bogus",
        f"host=127.0.0.1 port=1 user=app password={password}",
        f"host=127.0.0.1 port=1 user=app password='{escaped}' dbname=app",
        f"host=127.0.0.1 port=1 user=app password='{escaped}' bogus=1",
    ]


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_password_is_never_echoed_from_a_url_given_on_the_command_line(password):
    for url in _bad_urls(password):
        result = run_cli("list", "--database-url", url)
        assert result.exit_code == 1, (url, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
        _assert_absent(password, result.stdout, result.stderr)


@pytest.mark.parametrize("variable", ["JOBRUNNER_DATABASE_URL", "DATABASE_URL"])
@pytest.mark.parametrize("password", PASSWORDS[:3])
def test_a_password_is_never_echoed_from_a_url_in_the_environment(password, variable):
    for url in _bad_urls(password):
        result = run_cli("status", env={variable: url})
        assert result.exit_code == 1, (url, result.stderr)
        _assert_absent(password, result.stdout, result.stderr)


@pytest.mark.parametrize("password", PASSWORDS[:3])
def test_a_failed_connection_never_shows_the_password(password):
    url = f"postgresql://app:{quote(password, safe='')}@127.0.0.1:1/app"
    result = run_cli("list", "--database-url", url)
    assert result.exit_code == 1
    assert "cannot connect" in result.stderr
    _assert_absent(password, result.stdout, result.stderr)
    _assert_absent(quote(password, safe=""), result.stdout, result.stderr)


def _with_password(url: str, password: str) -> str:
    # The test server trusts local connections: the password travels but is never asked for.
    return conninfo.make_conninfo(url, password=password)


@pytest.mark.parametrize("password", [PASSWORDS[0], PASSWORDS[3]])
def test_a_handler_quoting_the_url_leaks_the_password_nowhere(db_url, password):
    url = _with_password(db_url, password)
    env = {"JOBRUNNER_DATABASE_URL": url}
    for job_type in ("test.leak_dsn", "test.leak_dsn_fail"):
        assert run_cli("enqueue", job_type, env=env).exit_code == 0
    tick = jobrunner_process("tick", "--handlers", HANDLERS, env=env)
    out, err = tick.communicate(timeout=60)
    assert tick.returncode == 0, err
    assert "run failed" in err or "failed" in err
    outputs = [out, err]
    for args in (
        ["show", "1"],
        ["show", "1", "--json"],
        ["show", "2"],
        ["list"],
        ["list", "--json"],
        ["status"],
        ["status", "--json"],
    ):
        result = run_cli(*args, env=env)
        assert result.exit_code == 0, result.stderr
        outputs += [result.stdout, result.stderr]
    shown = json.loads(run_cli("show", "1", "--json", env=env).stdout)
    assert "cannot reach" in shown["last_error"]
    assert shown["attempt_history"][0]["traceback"]
    _assert_absent(password, *outputs)


def test_a_stored_error_has_no_password(conn, db_url):
    password = PASSWORDS[1]
    url = _with_password(db_url, password)
    env = {"JOBRUNNER_DATABASE_URL": url}
    run_cli("enqueue", "test.leak_dsn", env=env)
    tick = jobrunner_process("tick", "--handlers", HANDLERS, env=env)
    tick.communicate(timeout=60)
    stored = conn.execute(
        "SELECT r.last_error || a.message || a.traceback"
        " FROM job_runs r JOIN job_attempts a ON a.run_id = r.id"
    ).fetchone()[0]
    assert "cannot reach" in stored
    _assert_absent(password, stored)


def test_passwords_jobrunner_was_never_told_about_are_removed_by_their_shape():
    text = "a postgresql://app:hunter22@db/app b app:pw2@db c password=pw3 d password='p w4' e"
    assert redact(text) == (
        "a postgresql://app:***@db/app b app:***@db c password=*** d password=*** e"
    )


def test_a_password_in_a_sql_statement_is_removed():
    text = "ALTER ROLE app PASSWORD 'it''s s3cret' VALID UNTIL 'infinity'"
    assert redact(text) == "ALTER ROLE app PASSWORD '***' VALID UNTIL 'infinity'"


def test_a_known_password_is_removed_however_it_was_written():
    password = "Kq'é \"\\x%41"
    quoted = password.replace("\\", "\\\\").replace("'", "\\'")
    remember_password(f"host=h password='{quoted}'")
    for spelling in (password, json.dumps(password)[1:-1], repr(password)[1:-1]):
        assert "Kq" not in redact(f"before {spelling} after")


@pytest.mark.parametrize(
    "text",
    [
        "://a:" * 40000,
        "=a:" * 40000,
        "password='" * 40000,
        "password '" * 40000,
        "password ''" * 40000,
        "=(" * 60000,
        "a:" * 60000,
        " a:b" * 40000,
        "postgresql://" + "u:" * 60000,
    ],
)
def test_redaction_is_linear_in_the_text(text):
    started = time.perf_counter()
    redact(text)
    # Quadratic patterns take minutes on these; linear ones a few milliseconds.
    assert time.perf_counter() - started < 1.0


def test_help_steers_the_password_away_from_the_command_line():
    result = run_cli("list", "--help")
    assert ".pgpass" in result.stdout
    assert "environment" in result.stdout


@pytest.mark.parametrize("password", ["it's\\secret!", "back\\slash", "quo'te"])
def test_a_password_escaped_in_a_key_value_string_is_known_unescaped(password):
    # make_conninfo escapes a quote or backslash without quoting the value (no space in it):
    # the password jobrunner remembers must be the one a message would show.
    remember_password(conninfo.make_conninfo("", host="db", password=password))
    assert password not in redact(f"authentication failed: {password}")


# Passwords with an unencoded @ (and the other characters a URL's parts are cut at): libpq
# ends the password at the first @ and reads what follows as the host, the port or the
# database, which its messages quote.
AT_PASSWORDS = [
    "Zq@xKvJwQz",
    "QwXz@JkVq@ZxWk",
    "QwXz@JkVq:ZxWk",
    "QwXz?JkVq@ZxWk",
    "QwXz@JkVq/ZxWk",
    "QwXz@JkVq,ZxWk",
    "QwXz/JkVq@ZxWk",
    "QwXz@JkVq#ZxWk",
]


def _assert_no_four_characters_of(password: str, text: str) -> None:
    for start in range(len(password) - 3):
        assert password[start : start + 4] not in text, (password, text)


@pytest.mark.parametrize("password", AT_PASSWORDS)
def test_no_part_of_a_password_with_an_unencoded_at_is_shown(password):
    url = f"postgresql://app:{password}@db.invalid/app"
    for args, env in [
        (["list", "--database-url", url], {}),
        (["list"], {"JOBRUNNER_DATABASE_URL": url}),
        (["tick", "--log-level", "debug"], {"JOBRUNNER_DATABASE_URL": url}),
    ]:
        process = jobrunner_process(*args, env=env)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 1, err
        assert "database" in err
        _assert_no_four_characters_of(password, out + err)


# As above, with pieces shorter than any literal replacement would take.
SHORT_AT_PASSWORDS = ["Qx@ZjK", "QwXzJk@Vq", "Qx@Zj:Kv", "Qx@Zj/Kv", "Qx@Zj,Kv", "QwX@Z@Jk"]


@pytest.mark.parametrize("password", SHORT_AT_PASSWORDS)
def test_no_piece_of_a_password_with_an_unencoded_at_is_shown_however_short(password):
    url = f"postgresql://app:{password}@db.invalid/app"
    pieces = [p for p in re.split(r"[@:/,]", password) if p]
    for args in (["list"], ["tick", "--log-level", "debug"]):
        process = jobrunner_process(*args, env={"JOBRUNNER_DATABASE_URL": url})
        out, err = process.communicate(timeout=60)
        assert process.returncode == 1, err
        assert "database" in err
        for piece in pieces:
            assert piece not in out + err, (piece, err)
