"""Bad usage, every kind the command line can meet: exit 2, one line on stderr, nothing on
stdout, nothing written; and no password in that line, whatever was typed where.

Each row is a way to misuse a command, read off the `raise BadInput`, `click.UsageError`
and `click.BadParameter` sites of cronjob/commands/ and the option types they use. A row
is written as typed in a shell; `--database-url` is added for the commands that take it.
The database the rows run against holds runs, a schedule, a pause and an audit trail, and
is compared whole before and after each row.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import ROOT, run_cli
from tests.factories import insert_runs

# The commands that take no --database-url: the command line's own errors, and preview.
_NO_DATABASE = ("nosuch", "--bogus", "schedule nosuch", "schedule preview")


def command(typed: str) -> list[str]:
    """`typed` as arguments, with `--database-url DB` for a command that takes one."""
    args = shlex.split(typed)
    return args if typed.startswith(_NO_DATABASE) else [*args, "--database-url", "DB"]


def row(typed: str, says: str, stdin: str | None = None, id: str | None = None) -> Any:
    """One bad usage: the command as typed, words its error line must hold, and stdin."""
    return pytest.param(command(typed), says, stdin, id=id or typed[:60])


LINE = '{"type": "t"}\n'
LONG_ACTOR, LONG_REASON, LONG_KEY = "a" * 201, "r" * 1001, "k" * 1001
ADD = "schedule add x --cron '* * * * *' --type t"

BAD_USAGE = [
    # the command line itself
    row("nosuch", "No such command 'nosuch'"),
    row("--bogus", "No such option '--bogus'"),
    row("list extra", "Got unexpected extra argument"),
    row("list --log-level loud", "'--log-level'"),
    row("schedule nosuch", "No such command 'nosuch'"),
    # migrate
    row("migrate --lock-wait forever", "--lock-wait"),
    # tick
    row("tick --concurrency 0", "'--concurrency'"),
    row("tick --async-concurrency 0", "'--async-concurrency'"),
    row("tick --batch-size 0", "'--batch-size'"),
    row("tick --max-runtime forever", "invalid max runtime"),
    row("tick --lease 0.5s", "must be at least 1s"),
    row("tick --grace soon", "invalid grace"),
    row("tick --prune-older-than old", "invalid --prune-older-than"),
    row("tick --metrics-textfile /nonexistent/m.prom", "does not exist"),
    row("tick --types no.such.type", "no handler registered"),
    row("tick --handlers tests.handlers.nosuch", "cannot import handler module"),
    row("tick --tenants-sql ' '", "empty tenant query"),
    row("tick --queues emails", ": it needs "),
    # enqueue
    row("enqueue", "missing TYPE"),
    row("enqueue --jsonl - t", "--jsonl takes every field from its lines", LINE),
    row("enqueue --jsonl - --payload {}", "--jsonl takes every field from its lines", LINE),
    row("enqueue --jsonl - --delay 1m", "--jsonl takes every field from its lines", LINE),
    row("enqueue --jsonl -", "--jsonl input has no runs", "\n", id="jsonl of no runs"),
    row("enqueue --jsonl -", "line 1: expected a JSON object", "[1]\n", id="jsonl array"),
    row(
        "enqueue --jsonl -",
        "line 1: unknown key",
        '{"type": "t", "colour": "red"}\n',
        id="jsonl unknown key",
    ),
    row("enqueue --jsonl -", 'line 1: missing "type"', '{"payload": {}}\n', id="jsonl no type"),
    row(
        "enqueue --jsonl -",
        "line 1: invalid delay",
        '{"type": "t", "delay": "soon"}\n',
        id="jsonl bad delay",
    ),
    row("enqueue --jsonl -", "line 2", LINE + "{nope\n", id="jsonl bad second line"),
    row("enqueue t --payload {} --payload-file -", "either --payload or --payload-file"),
    row("enqueue t --payload {nope", "invalid JSON"),
    row("enqueue t --payload-file /nonexistent", "'--payload-file'"),
    row("enqueue t --delay soon", "invalid --delay"),
    row("enqueue t --run-at tuesday", "--run-at"),
    row("enqueue t --run-at 2030-01-01T00:00:00Z --delay 1m", "not both"),
    row("enqueue t --max-attempts 0", "invalid --max-attempts"),
    row("enqueue t --priority high", "priority"),
    row(f"enqueue t --idempotency-key {LONG_KEY}", "longer than 1000", id="long key"),
    row("enqueue t --lock-wait forever", "--lock-wait"),
    # retry and cancel
    row("retry", "give run ids or filters"),
    row("cancel", "give run ids or filters"),
    row("retry 1 --status dead", "not both"),
    row("cancel 1 --type t", "not both"),
    row("retry abc", "invalid run id 'abc'"),
    row("retry --status ,", "invalid --status: empty"),
    row("retry --status succeeded", "cannot retry succeeded runs"),
    row("cancel --status dead", "cannot cancel dead runs"),
    row("retry --type ,", "invalid --type: empty"),
    row("cancel --tenant ,", "invalid --tenant: empty"),
    row("retry --error-type ,", "invalid --error-type: empty"),
    row("retry --error-like ' '", "invalid --error-like"),
    row("retry --status dead --since yesterday", "invalid --since"),
    row("retry --status dead --until later", "invalid --until"),
    row("retry --status dead --limit 0", "'--limit'"),
    row("retry --status dead", "add --yes", id="retry of over 100 runs without --yes"),
    row(f"cancel 1 --actor {LONG_ACTOR}", "invalid --actor", id="cancel, a long actor"),
    row(f"retry 1 --reason {LONG_REASON}", "--reason", id="retry, a long reason"),
    # list and show
    row("list --status exploded", "unknown status"),
    row("list --limit 0", "'--limit'"),
    row("show", "Missing argument"),
    row("show abc", "invalid run id 'abc'"),
    # status, metrics, check, audit
    row("status --unclaimed-after soon", "invalid --unclaimed-after"),
    row("metrics --textfile ''", "expected a file path"),
    row("metrics --textfile /nonexistent/m.prom", "does not exist"),
    row("metrics --textfile /tmp", "it is a directory"),
    row("check", "nothing to check"),
    row("check --include-paused", "nothing to check"),
    row("check --max-dead 0 --include-paused", "--include-paused applies to --stale-schedules"),
    row("check --max-queue-age soon", "invalid --max-queue-age"),
    row("check --max-stuck -1", "'--max-stuck'"),
    row("check --max-dead many", "'--max-dead'"),
    row("audit --since soon", "invalid --since"),
    # prune
    row("prune", "nothing to prune"),
    row("prune 1 --type t", "not both"),
    row("prune 1 --older-than 1d", "not both"),
    row("prune --older-than 1d --status queued", "cannot prune queued runs"),
    row("prune --older-than old", "invalid --older-than"),
    row("prune --older-than 1d --keep-effects x", "invalid --keep-effects"),
    row("prune --audit-older-than x", "invalid --audit-older-than"),
    row("prune --older-than 1d --batch-size 0", "'--batch-size'"),
    row("prune --type t", "add --yes", id="prune of over 100 runs without --yes"),
    # pause and resume
    row("pause", "give at least one job type"),
    row("resume", "give at least one job type"),
    row("pause ''", "invalid job type: must not be empty"),
    row(f"pause t --actor {LONG_ACTOR}", "invalid --actor", id="pause, a long actor"),
    row(f"resume t --reason {LONG_REASON}", "--reason", id="resume, a long reason"),
    # schedules
    row("schedule add x --type t", "'--cron'"),
    row("schedule add x --cron '* * * * *'", "'--type'"),
    row("schedule add x --cron '61 * * * *' --type t", "minute"),
    row("schedule add x --cron '0 9 * * fri-mon' --type t", "fri-7,mon"),
    row("schedule add 'bad name!' --cron '* * * * *' --type t", "invalid schedule name"),
    row(f"{ADD} --timezone Mars/Olympus", "timezone"),
    row(f"{ADD} --scope cosmic", "'--scope'"),
    row(f"{ADD} --catch-up sometimes", "'--catch-up'"),
    row(f"{ADD} --overlap maybe", "'--overlap'"),
    row(f"{ADD} --catch-up-limit 5", "catch-up policy 'all' only"),
    row(f"{ADD} --max-attempts 0", "max attempts"),
    row(f"{ADD} --priority high", "priority"),
    row(f"{ADD} --payload {{nope", "invalid JSON"),
    row(f"{ADD} --expect-within forever", "expect_within"),
    row(f"{ADD} --ping-url ftp://example.com/ping", "http:// or https://"),
    row(f"{ADD} --ping-failure-url https://example.com/fail", "needs ping_url"),
    row("schedule sync /nonexistent.toml", "'FILE'"),
    row("schedule sync -", "invalid TOML", "x = [\n", id="schedule sync, not TOML"),
    row(
        "schedule sync -",
        "missing key 'type'",
        '[schedules.x]\ncron = "* * * * *"\n',
        id="schedule sync, a schedule without its type",
    ),
    row("schedule sync - --lock-wait x", "--lock-wait", ""),
    row("schedule show", "Missing argument"),
    row("schedule preview '61 * * * *'", "minute"),
    row("schedule preview '* * * * *' --timezone Mars/Olympus", "timezone"),
    row("schedule preview '* * * * *' --from tomorrow", "invalid --from"),
    row("schedule preview '* * * * *' --count 0", "'--count'"),
    # demo, and Django's sync outside a Django project
    row("demo", "--write-to-configured-database"),
    row("sync", ": it needs "),
]


def with_url(args: list[str], url: str) -> list[str]:
    return [url if arg == "DB" else arg for arg in args]


def snapshot(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, str]]:
    """Every row of every table, as a count and a digest per table."""
    tables = [
        name
        for (name,) in conn.execute(
            "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public'"
        )
    ]
    return {
        table: conn.execute(
            f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), ''))"
            f" FROM {table} t"
        ).fetchone()
        for table in tables
    }


@pytest.fixture(scope="module")
def busy_database(database_url: str) -> Iterator[tuple[str, psycopg.Connection[Any]]]:
    """The test database holding something of everything a command could change: more dead
    runs than a selection may act on without --yes, a schedule, a pause, audit rows."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        tables = ", ".join(
            name
            for (name,) in conn.execute(
                "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public'"
                " AND tablename <> 'jobrunner_migrations'"
            )
        )
        conn.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
        insert_runs(conn, 101, "t", status="dead", attempts=1, last_error="boom")
        insert_runs(conn, 2, "t")
        for args in (
            ["schedule", "add", "nightly", "--cron", "0 2 * * *", "--type", "t"],
            ["pause", "other.type", "--reason", "incident"],
        ):
            assert run_cli(*args, "--database-url", database_url).exit_code == 0
        yield database_url, conn


@pytest.mark.parametrize(("args", "says", "stdin"), BAD_USAGE)
def test_bad_usage_is_exit_2_with_one_line_and_writes_nothing(busy_database, args, says, stdin):
    url, conn = busy_database
    before = snapshot(conn)

    result = run_cli(*with_url(args, url), input=stdin)

    assert result.exit_code == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""
    assert snapshot(conn) == before


# -- no password in an error line, wherever it was typed -----------------------------

PASSWORD = "S3cret-Passw0rd"
# Generated passwords are long: an error that clips the value it echoes must not clip
# away the part of a URL that shows where the password ends.
LONG_PASSWORD = "Xk7vQ2mP9sL4wR8tY1uZ6nB3cF5hJ0dGa8Ke2Wq5Rt7Yu1Io3Pl6Mn9Bv4Cx0Zs"
SECRETS = {
    "url": (PASSWORD, f"postgresql://app:{PASSWORD}@db.internal/app"),
    "url, long password": (
        LONG_PASSWORD,
        f"postgresql://jobrunner_worker:{LONG_PASSWORD}@db.internal:5432/app",
    ),
    "key=value": (PASSWORD, f"host=db.internal user=app password={PASSWORD}"),
}

# Each row puts the secret (`URL`) where something else was expected.
MISPLACED = [
    command(typed)
    for typed in [
        "URL",
        "schedule URL",
        "list URL",
        "list --status URL",
        "list --limit URL",
        "list --log-level URL",
        "show URL",
        "retry URL",
        "cancel URL",
        "prune URL",
        "retry --type t --since URL",
        "migrate --lock-wait URL",
        "tick --max-runtime URL",
        "tick --concurrency URL",
        "tick --async-concurrency URL",
        "tick --types URL",
        "tick --handlers URL",
        "enqueue t --delay URL",
        "enqueue t --run-at URL",
        "enqueue t --priority URL",
        "enqueue t --max-attempts URL",
        "enqueue t --payload URL",
        "enqueue t --payload-file URL",
        "enqueue --jsonl URL",
        "status --unclaimed-after URL",
        "check --max-queue-age URL",
        "check --max-dead URL",
        "audit --since URL",
        "prune --older-than URL",
        "schedule add URL --cron '* * * * *' --type t",
        "schedule add x --cron URL --type t",
        *(
            f"{ADD} {option} URL"
            for option in ("--timezone", "--scope", "--ping-url", "--expect-within")
        ),
        "schedule sync URL",
        "schedule preview URL",
        "schedule preview '* * * * *' --timezone URL",
        "schedule preview '* * * * *' --from URL",
    ]
]
# A URL is a path to a file that may exist: where a file is to be written, only a URL
# whose directory is missing is bad usage (key=value text names a file of the current one).
MISPLACED_PATHS = [command("metrics --textfile URL"), command("tick --metrics-textfile URL")]


def shown_pieces(password: str, text: str) -> list[str]:
    """Every six characters of `password` in a row that `text` shows."""
    return [password[i : i + 6] for i in range(len(password) - 5) if password[i : i + 6] in text]


def misplaced() -> Iterator[Any]:
    """Each misplaced secret in each of its spellings, as typed."""
    for args in MISPLACED + MISPLACED_PATHS:
        shown = " ".join(arg for arg in args if arg not in ("--database-url", "DB"))
        for spelling, (password, secret) in SECRETS.items():
            if args in MISPLACED_PATHS and "://" not in secret:
                continue
            typed = [secret if arg == "URL" else arg for arg in args]
            yield pytest.param(typed, password, id=f"{shown} [{spelling}]")


@pytest.mark.parametrize(("args", "password"), list(misplaced()))
def test_a_password_typed_where_something_else_was_expected_is_never_shown(
    database_url, args, password
):
    result = run_cli(*with_url(args, database_url))

    assert result.exit_code == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert shown_pieces(password, result.stdout + result.stderr) == [], result.stderr


# URLs libpq refuses, each naming the password's owner: the refusal is exit 1, not 2.
UNUSABLE = [
    (PASSWORD, f"postgresql://app:{PASSWORD}@db.internal/app?sslmode=bogus"),
    (PASSWORD, f"postgresql://app:{PASSWORD}@db.internal:notaport/app"),
    (LONG_PASSWORD, f"postgresql://jobrunner_worker:{LONG_PASSWORD}@db.internal/app?x=1"),
    (PASSWORD, f"host=db.internal user=app password={PASSWORD} port=notaport"),
    (PASSWORD, f"host=db.internal user=app password={PASSWORD} bogus=1"),
]


@pytest.mark.parametrize(("password", "url"), UNUSABLE)
def test_a_database_url_that_cannot_be_used_is_exit_1_without_its_password(password, url):
    result = run_cli("list", "--database-url", url)
    assert result.exit_code == 1, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert shown_pieces(password, result.stdout + result.stderr) == [], result.stderr


def test_the_jobrunner_script_shows_no_password_typed_in_place_of_an_argument(database_url):
    script = Path(sys.executable).with_name("jobrunner")
    jobrunner = [str(script)] if script.exists() else [sys.executable, "-m", "cronjob"]
    for password, secret in SECRETS.values():
        done = subprocess.run(
            [*jobrunner, "list", secret, "--database-url", database_url],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert "Got unexpected extra argument" in done.stderr
        assert shown_pieces(password, done.stdout + done.stderr) == [], done.stderr
