"""jobrunner's commands as the least-privilege roles of deploy/roles.sql, on a real server.

The database is set up the documented way: roles.sql, `jobrunner migrate` as a login of
jobrunner_owner, roles.sql again, and a login in each role. Then every command runs as
each of them: ROLE_TABLE says who may (it is the table of deploy/README.md), and everyone
else gets one line saying permission denied, and exit 1. Then each role tries, in plain
SQL, what the review found it could do: read payloads, write schedules, rewrite the audit
trail.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import run_cli
from tests.factories import insert_run
from tests.test_deploy import (  # noqa: F401 - fixture
    DEPLOY,
    Database,
    Server,
    server,
    throwaway_database,
)

ROLES = ("owner", "worker", "enqueuer", "reader", "operator")
OWNER, WORKER, ENQUEUER, READER, OPERATOR = ROLES
EVERYONE = frozenset(ROLES)
TICKS = frozenset({OWNER, WORKER})
ENQUEUES = frozenset({OWNER, WORKER, ENQUEUER})
READS = frozenset({OWNER, WORKER, READER})
OPERATES = frozenset({OWNER, OPERATOR})

# Each command, and the roles that may run it: the role table of deploy/README.md.
ROLE_TABLE: dict[str, frozenset[str]] = {
    "migrate": frozenset({OWNER}),
    "tick": TICKS,
    "tick --listen": TICKS,
    "enqueue": ENQUEUES,
    "enqueue --jsonl": ENQUEUES,
    "retry": OPERATES,
    "cancel": OPERATES,
    "prune": OPERATES,
    "prune --audit-older-than": frozenset({OWNER}),
    "pause": OPERATES,
    "resume": OPERATES,
    "limit": OPERATES,
    "limits": READS | {OPERATOR},  # what it manages
    "schedule add": OPERATES,
    "schedule pause": OPERATES,
    "schedule resume": OPERATES,
    "schedule remove": OPERATES,
    "schedule sync": OPERATES,
    "list": READS,
    "show": READS,
    "status": READS,
    "metrics": READS,
    "check": READS,
    "schedule list": READS | {OPERATOR},  # what it manages
    "schedule show": READS,
    "audit": frozenset({OWNER, READER}),
    "schedule preview": EVERYONE,  # needs no database
    "wait": READS | {OPERATOR},  # a run's id, status and finish time
}
# The Django backend's, run by the Django suite (tests/django_suite/test_django_roles.py).
DJANGO_ROLE_TABLE: dict[str, frozenset[str]] = {
    "Task.enqueue()": ENQUEUES,
    "get_result()": READS,
}


@dataclass
class World:
    """The database the commands run on, and what they need made before each of them."""

    db: Database
    logins: dict[str, str]
    tmp: Path
    made: Iterator[int] = field(default_factory=itertools.count)

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{next(self.made)}"

    def run(self, **columns: Any) -> str:
        with psycopg.connect(self.db.admin, autocommit=True) as conn:
            return str(insert_run(conn, "test.ok", **columns))

    def schedule(self, *, enabled: bool = True) -> str:
        name = self.unique("schedule")
        added = run_cli(
            "schedule", "add", name, *NEW_SCHEDULE, "--database-url", self.logins[OWNER]
        )
        assert added.exit_code == 0, added.stderr
        if not enabled:
            run_cli("schedule", "pause", name, "--database-url", self.logins[OWNER])
        return name

    def paused_type(self) -> str:
        job_type = self.unique("paused")
        assert run_cli("pause", job_type, "--database-url", self.logins[OWNER]).exit_code == 0
        return job_type

    def file(self, text: str) -> str:
        path = self.tmp / self.unique("input")
        path.write_text(text)
        return str(path)


def _tick(world: World) -> list[str]:
    """A tick with a run to claim, finished runs to prune after it, metrics to write."""
    world.run()
    world.run(status="succeeded")
    textfile = str(world.tmp / "jobrunner.prom")
    return [
        "tick",
        "--handlers",
        "tests.handlers.basic",
        "--types",
        "test.ok",
        "--prune-older-than",
        "0s",
        "--metrics-textfile",
        textfile,
    ]


JSONL = '{"type": "test.ok", "idempotency_key": "K", "tenant": "acme"}\n{"type": "test.ok"}\n'
NEW_SCHEDULE = ("--cron", "@daily", "--type", "t")


def _schedule_file(world: World) -> str:
    return world.file(f'[schedules.{world.unique("synced")}]\ncron = "@daily"\ntype = "t"\n')


# What each command is given, made afresh each time: a run to retry, a schedule to remove...
ARGUMENTS: dict[str, Callable[[World], Sequence[str]]] = {
    "migrate": lambda w: ["migrate"],
    "tick": _tick,
    "enqueue": lambda w: ["enqueue", "test.ok", "--idempotency-key", "K", "--tenant", "acme"],
    "enqueue --jsonl": lambda w: ["enqueue", "--jsonl", w.file(JSONL)],
    "retry": lambda w: ["retry", w.run(status="dead", attempts=1)],
    "cancel": lambda w: ["cancel", w.run()],
    "prune": lambda w: ["prune", w.run(status="succeeded")],
    "prune --audit-older-than": lambda w: ["prune", "--audit-older-than", "3650d"],
    "pause": lambda w: ["pause", w.unique("type")],
    "resume": lambda w: ["resume", w.paused_type()],
    "limit": lambda w: ["limit", w.unique("type"), "--concurrency", "2", "--rate", "5/1s"],
    "limits": lambda w: ["limits", "--json"],
    "schedule add": lambda w: ["schedule", "add", w.unique("new"), *NEW_SCHEDULE],
    "schedule pause": lambda w: ["schedule", "pause", w.schedule()],
    "schedule resume": lambda w: ["schedule", "resume", w.schedule(enabled=False)],
    "schedule remove": lambda w: ["schedule", "remove", w.schedule()],
    "schedule sync": lambda w: ["schedule", "sync", _schedule_file(w)],
    "list": lambda w: ["list", "--json"],
    "show": lambda w: ["show", w.run(status="dead", attempts=1)],
    "status": lambda w: ["status", "--json"],
    "metrics": lambda w: ["metrics"],
    "check": lambda w: ["check", "--max-dead", "1000000", "--stale-schedules"],
    "schedule list": lambda w: ["schedule", "list", "--json"],
    "schedule show": lambda w: ["schedule", "show", w.schedule()],
    "audit": lambda w: ["audit", "--json"],
    "schedule preview": lambda w: ["schedule", "preview", "@daily"],
    "tick --listen": lambda w: [*_tick(w), "--listen", "--max-runtime", "0.5s"],
    "wait": lambda w: ["wait", w.run(status="succeeded"), "--timeout", "10s"],
}


@pytest.fixture(scope="module")
def world(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:  # noqa: F811
    with throwaway_database(server) as db:
        db.roles_sql()
        owner = db.login("jobrunner_owner")
        migrated = run_cli("migrate", "--database-url", owner)
        assert migrated.exit_code == 0, migrated.stderr
        db.roles_sql()
        logins = {OWNER: owner}
        logins.update({role: db.login(f"jobrunner_{role}") for role in ROLES[1:]})
        yield World(db, logins, tmp_path_factory.mktemp("roles"))


def as_role(world: World, role: str, *args: str) -> Any:
    url = [] if args[:2] == ("schedule", "preview") else ["--database-url", world.logins[role]]
    return run_cli(*args, *url)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("command", ROLE_TABLE)
def test_each_role_runs_its_commands_and_is_told_it_may_not_run_the_others(
    world: World, command: str, role: str
) -> None:
    result = as_role(world, role, *ARGUMENTS[command](world))

    if role in ROLE_TABLE[command]:
        assert result.exit_code == 0, result.stderr
    else:
        assert result.exit_code == 1, (result.stdout, result.stderr)
        [line] = result.stderr.strip().splitlines()[-1:]
        assert "permission denied" in line, result.stderr
        assert "Traceback" not in result.stderr


def test_deploy_readme_shows_the_role_table_the_server_enforces() -> None:
    text = (DEPLOY / "README.md").read_text()
    header = "| command | " + " | ".join(ROLES) + " |"
    assert header in text
    rows = text[text.index(header) :].splitlines()[2:]
    shown = {}
    for row in itertools.takewhile(lambda line: line.startswith("|"), rows):
        command, *marks = [cell.strip() for cell in row.strip("|").split("|")]
        shown[command.strip("`")] = frozenset(r for r, m in zip(ROLES, marks, strict=True) if m)
    assert shown == {**ROLE_TABLE, **DJANGO_ROLE_TABLE}


# -- what each role cannot do, in plain SQL ------------------------------------------------


def refused(url: str, statement: str, *params: Any) -> bool:
    """Whether the server refuses `statement` to the login of `url` for want of a privilege."""
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            conn.execute(statement, params or None)
        except psycopg.errors.InsufficientPrivilege:
            return True
    return False


def test_the_enqueuer_reads_no_payload_error_or_result_and_changes_no_run(world: World) -> None:
    url = world.logins[ENQUEUER]
    run_id = world.run(status="dead", attempts=1, last_error="card 4242 declined")

    for column in ("payload", "last_error", "return_value", "status", "locked_by"):
        assert refused(url, f"SELECT {column} FROM job_runs WHERE id = %s", run_id), column
    assert refused(url, "SELECT * FROM job_attempts")
    assert refused(url, "UPDATE job_runs SET run_at = now() WHERE id = %s", run_id)
    assert refused(url, "DELETE FROM job_runs WHERE id = %s", run_id)
    # An enqueue sets what an enqueue may: not a status, an outcome, a schedule's occurrence.
    assert refused(
        url, "INSERT INTO job_runs (job_type, status, finished_at) VALUES ('t', 'succeeded', now())"
    )
    assert refused(
        url, "INSERT INTO job_runs (job_type, definition_id, scheduled_for) VALUES ('t', 1, now())"
    )
    assert refused(url, "SELECT * FROM job_definitions")
    assert refused(url, "INSERT INTO job_type_pauses (job_type, paused_by) VALUES ('t', 'x')")


def test_the_enqueuer_bulk_enqueues_by_copy(world: World) -> None:
    from cronjob.api import enqueue_many, new_run

    lines = "".join(json.dumps({"type": "bulk", "payload": {"i": i}}) + "\n" for i in range(50))
    result = as_role(world, ENQUEUER, "enqueue", "--jsonl", world.file(lines))
    assert result.exit_code == 0, result.stderr
    runs = [new_run("bulk", {"i": i}, tenant_id="acme", delay=60) for i in range(50)]
    with psycopg.connect(world.logins[ENQUEUER]) as conn:
        ids = enqueue_many(conn, runs)
    with psycopg.connect(world.db.admin) as conn:
        found = conn.execute(
            "SELECT count(*) FILTER (WHERE tenant_id = 'acme' AND id = ANY(%s)), count(*)"
            " FROM job_runs WHERE job_type = 'bulk'",
            [ids],
        ).fetchone()
    assert found == (50, 100)


def test_the_enqueuer_may_insert_exactly_the_columns_an_enqueue_sets(world: World) -> None:
    from cronjob.run_options import RUN_OPTIONS

    # run_options.py declares what a run can be enqueued with: each option stored in a column
    # needs that column in the enqueuer's INSERT grant of deploy/roles.sql, and no more.
    stored = {option.column for option in RUN_OPTIONS.values() if option.column}
    with psycopg.connect(world.db.admin) as conn:
        insertable = {
            row[0]
            for row in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'job_runs'::regclass"
                " AND attnum > 0 AND NOT attisdropped"
                " AND has_column_privilege('jobrunner_enqueuer', attrelid, attnum, 'INSERT')"
            )
        }
    assert insertable == {"id", "job_type", "payload", "created_at", "updated_at", *stored}


def test_the_worker_writes_no_schedule_pause_or_audit_entry(world: World) -> None:
    url = world.logins[WORKER]

    assert refused(
        url,
        "INSERT INTO job_definitions (name, job_type, schedule)"
        " VALUES ('sneaky', 't', '* * * * *')",
    )
    assert refused(url, "DELETE FROM job_definitions")
    assert refused(url, "DELETE FROM job_type_pauses")
    assert refused(url, "INSERT INTO job_audit (actor, command) VALUES ('x', 'prune')")
    assert refused(url, "SELECT * FROM job_audit")


def test_a_workers_tick_keeps_run_logs_that_a_reader_shows_and_an_operator_prunes(
    world: World,
) -> None:
    with psycopg.connect(world.db.admin, autocommit=True) as conn:
        run_id = str(insert_run(conn, "test.chatty", max_attempts=1))
    logs = "SELECT count(*) FROM job_run_logs WHERE run_id = %s"

    ticked = as_role(
        world, WORKER, "tick", "--handlers", "tests.handlers.observed", "--types", "test.chatty"
    )
    assert ticked.exit_code == 0, ticked.stderr
    with psycopg.connect(world.db.admin) as conn:
        assert conn.execute(logs, (run_id,)).fetchone()[0] == 1
    shown = as_role(world, READER, "show", run_id)
    assert shown.exit_code == 0, shown.stderr
    assert "charging card" in shown.stdout
    pruned = as_role(world, OPERATOR, "prune", run_id)
    assert pruned.exit_code == 0, pruned.stderr
    with psycopg.connect(world.db.admin) as conn:
        assert conn.execute(logs, (run_id,)).fetchone()[0] == 0


def test_the_operator_reads_no_payload_or_result_and_sets_no_lease(world: World) -> None:
    url = world.logins[OPERATOR]
    run_id = world.run()

    assert refused(url, "SELECT payload FROM job_runs WHERE id = %s", run_id)
    assert refused(url, "SELECT return_value FROM job_runs WHERE id = %s", run_id)
    assert refused(url, "SELECT traceback FROM job_attempts")
    assert refused(url, "UPDATE job_runs SET payload = '{}' WHERE id = %s", run_id)
    assert refused(url, "UPDATE job_runs SET max_attempts = 1000 WHERE id = %s", run_id)
    assert refused(url, "INSERT INTO job_runs (job_type) VALUES ('t')")


# -- the audit trail -----------------------------------------------------------------------

NOT_OWNERS = ROLES[1:]


def audit_entry(world: World, entry_id: int) -> dict[str, Any]:
    with psycopg.connect(world.db.admin) as conn:
        cursor = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cursor.execute("SELECT * FROM job_audit WHERE id = %s", [entry_id]).fetchone()


def an_entry(world: World) -> int:
    """An operator's audit entry of a pause; returns its id."""
    paused = run_cli(
        "pause",
        world.unique("type"),
        "--reason",
        "bad deploy",
        "--database-url",
        world.logins[OPERATOR],
    )
    assert paused.exit_code == 0, paused.stderr
    entries = json.loads(run_cli("audit", "--json", "--database-url", world.logins[READER]).stdout)
    return entries[-1]["id"]


@pytest.mark.parametrize("role", NOT_OWNERS)
def test_no_role_but_the_owner_rewrites_or_trims_the_audit_trail(world: World, role: str) -> None:
    entry = an_entry(world)
    before = audit_entry(world, entry)
    url = world.logins[role]

    assert refused(
        url, "UPDATE job_audit SET actor = 'someone else', reason = 'routine' WHERE id = %s", entry
    )
    assert refused(url, "DELETE FROM job_audit WHERE id = %s", entry)
    assert refused(url, "TRUNCATE job_audit")
    assert refused(url, "UPDATE job_audit_batches SET changed = 0")
    assert refused(url, "DELETE FROM job_audit_batches")
    assert audit_entry(world, entry) == before


def test_a_grant_given_by_mistake_does_not_reopen_the_audit_trail(world: World) -> None:
    entry = an_entry(world)
    with psycopg.connect(world.db.admin, autocommit=True) as admin:
        admin.execute(
            "GRANT UPDATE, DELETE, TRUNCATE ON job_audit, job_audit_batches"
            " TO jobrunner_worker, jobrunner_operator"
        )
    try:
        for role in (WORKER, OPERATOR):
            url = world.logins[role]
            assert refused(url, "UPDATE job_audit SET reason = 'forged' WHERE id = %s", entry)
            assert refused(url, "DELETE FROM job_audit WHERE id = %s", entry)
            assert refused(url, "TRUNCATE job_audit, job_audit_batches")
            trimmed = run_cli("prune", "--audit-older-than", "0s", "--database-url", url)
            assert trimmed.exit_code == 1 and "permission denied" in trimmed.stderr
    finally:
        world.db.roles_sql()  # takes the mistaken grants back
    assert audit_entry(world, entry)["reason"] == "bad deploy"


@pytest.mark.parametrize("role", NOT_OWNERS)
def test_an_entry_forged_in_sql_carries_the_real_login_and_time(world: World, role: str) -> None:
    forge = (
        "INSERT INTO job_audit (at, actor, login, command, changed, reason)"
        " VALUES ('2001-01-01', 'alice', 'jobrunner_owner', 'prune', 0, 'backdated')"
        " RETURNING id"
    )
    if role != OPERATOR:
        assert refused(world.logins[role], forge)
        return
    with psycopg.connect(world.logins[role], autocommit=True) as conn:
        [forged] = conn.execute(forge).fetchone()
        clock = conn.execute("SELECT now()").fetchone()[0]

    entry = audit_entry(world, forged)
    assert entry["login"] == _login_name(world.logins[role]) != "jobrunner_owner"
    assert abs((entry["at"] - clock).total_seconds()) < 60
    assert entry["actor"] == "alice"  # what was declared, beside who wrote it


def test_a_batch_cannot_be_added_to_another_logins_entry(world: World) -> None:
    entry = an_entry(world)
    other = world.db.login("jobrunner_operator")

    assert refused(
        other, "INSERT INTO job_audit_batches (audit_id, changed) VALUES (%s, 1000)", entry
    )


def test_audit_shows_the_login_beside_the_declared_actor(world: World) -> None:
    paused = run_cli(
        "pause", world.unique("type"), "--actor", "alice", "--database-url", world.logins[OPERATOR]
    )
    assert paused.exit_code == 0, paused.stderr

    listed = run_cli("audit", "--json", "--database-url", world.logins[READER])
    entry = json.loads(listed.stdout)[-1]
    assert (entry["actor"], entry["login"]) == ("alice", _login_name(world.logins[OPERATOR]))
    table = run_cli("audit", "--database-url", world.logins[READER]).stdout
    assert re.search(rf"alice\s+{entry['login']}\s+pause", table), table


def _login_name(url: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(url)["user"]


# -- migrating ------------------------------------------------------------------------------


def test_the_owner_migrates_again_as_a_no_op(world: World) -> None:
    result = run_cli("migrate", "--database-url", world.logins[OWNER])
    assert result.exit_code == 0, result.stderr
    assert "schema up to date" in result.stderr


def test_a_role_that_cannot_migrate_is_told_to_migrate_as_the_owner(world: World) -> None:
    result = run_cli("migrate", "--database-url", world.logins[WORKER])
    assert result.exit_code == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("jobrunner: error: cannot migrate as role jr_test_worker_")
    assert "permission denied for schema public" in line
    assert "run `jobrunner migrate` as the schema owner" in line


def test_the_reader_serves_every_page_of_the_dashboard(world: World) -> None:
    pytest.importorskip("starlette")
    from cronjob.web import app
    from tests.web_server import request, serving

    run_id = world.run(status="dead", attempts=1, payload={"to": "ada@example.com"})
    schedule = world.schedule()
    pages = ("/", "/runs", f"/runs/{run_id}", "/schedules", f"/schedules/{schedule}", "/audit")

    with serving(app(world.logins[READER], show_payloads=True)) as base:
        answers = {page: request(base + page) for page in pages}

    assert {page: answer.status for page, answer in answers.items()} == dict.fromkeys(pages, 200)
    assert "ada@example.com" in answers[f"/runs/{run_id}"].body


def test_a_reader_who_does_not_operate_cannot_act_from_the_dashboard(world: World) -> None:
    pytest.importorskip("starlette")
    from cronjob.web import app
    from tests.web_server import request, serving

    run_id = world.run(status="dead", attempts=1)
    with serving(app(world.logins[READER], allow_actions=True)) as base:
        page = request(f"{base}/runs/{run_id}")
        cookie = page.headers["set-cookie"].split(";")[0]
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.body).group(1)
        answer = request(
            f"{base}/actions/runs/{run_id}",
            method="POST",
            form={"command": "retry", "csrf_token": token},
            headers={"Cookie": cookie},
        )

    assert answer.status == 403
    assert "permission denied" in answer.body
    with psycopg.connect(world.db.admin) as conn:
        status = conn.execute("SELECT status FROM job_runs WHERE id = %s", (run_id,)).fetchone()
    assert status == ("dead",)
