"""jobrunner's commands as the least-privilege roles of deploy/roles.sql, on a real server.

The database is set up the documented way: roles.sql, `jobrunner migrate` as a login of
jobrunner_owner, roles.sql again, and a login in each role. Then every command runs as
each of them: ROLE_TABLE says who may (it is the table of deploy/README.md), and everyone
else gets one line saying permission denied, and exit 1. Then each role tries, in plain
SQL, what the review found it could do: read payloads, write schedules, rewrite the audit
trail.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
    "enqueue --jsonl --then": ENQUEUES,
    "retry": OPERATES,
    "retry --batch": OPERATES,
    "cancel": OPERATES,
    "cancel --batch": OPERATES,
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
    "batches": READS | {OPERATOR},  # what it retries and cancels
    "batch show": READS | {OPERATOR},
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

    def run(self, job_type: str = "test.ok", **columns: Any) -> str:
        with psycopg.connect(self.db.admin, autocommit=True) as conn:
            return str(insert_run(conn, job_type, **columns))

    def batch(self) -> str:
        """A batch of one queued run and one dead one."""
        with psycopg.connect(self.db.admin, autocommit=True) as conn:
            batch_id = conn.execute(
                "INSERT INTO job_batches (then_type) VALUES ('t') RETURNING id"
            ).fetchone()[0]
            insert_run(conn, "test.ok", batch_id=batch_id)
            insert_run(conn, "test.ok", batch_id=batch_id, status="dead", attempts=1)
        return str(batch_id)

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
    "enqueue --jsonl --then": lambda w: ["enqueue", "--jsonl", w.file(JSONL), "--then", "t"],
    "retry --batch": lambda w: ["retry", "--batch", w.batch(), "--yes"],
    "cancel --batch": lambda w: ["cancel", "--batch", w.batch(), "--yes"],
    "batches": lambda w: ["batches"],
    "batch show": lambda w: ["batch", "show", w.batch()],
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


def _world(db: Database, tmp: Path, *, roles_sql_after_migrate: bool) -> World:
    db.roles_sql()
    owner = db.login("jobrunner_owner")
    migrated = run_cli("migrate", "--database-url", owner)
    assert migrated.exit_code == 0, migrated.stderr
    if roles_sql_after_migrate:
        db.roles_sql()
    logins = {OWNER: owner}
    logins.update({role: db.login(f"jobrunner_{role}") for role in ROLES[1:]})
    return World(db, logins, tmp)


@pytest.fixture(scope="module")
def world(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:  # noqa: F811
    """The documented order: roles.sql, migrate, roles.sql again."""
    with throwaway_database(server) as db:
        yield _world(db, tmp_path_factory.mktemp("roles"), roles_sql_after_migrate=True)


@pytest.fixture(scope="module")
def world_roles_sql_once(
    server: Server,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    """The order of a flow that runs roles.sql once, before migrate, and never after it (the
    Kubernetes manifests of deploy/): the migrations alone give each role its grants."""
    with throwaway_database(server) as db:
        yield _world(db, tmp_path_factory.mktemp("roles_once"), roles_sql_after_migrate=False)


@pytest.fixture(params=["roles.sql before and after migrate", "roles.sql before migrate only"])
def each_world(request: pytest.FixtureRequest) -> World:
    """Each of the two orders a database is set up in: whatever the order, the same grants."""
    once = request.param.endswith("only")
    return request.getfixturevalue("world_roles_sql_once" if once else "world")


def as_role(world: World, role: str, *args: str) -> Any:
    url = [] if args[:2] == ("schedule", "preview") else ["--database-url", world.logins[role]]
    return run_cli(*args, *url)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("command", ROLE_TABLE)
def test_each_role_runs_its_commands_and_is_told_it_may_not_run_the_others(
    each_world: World, command: str, role: str
) -> None:
    result = as_role(each_world, role, *ARGUMENTS[command](each_world))

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


# -- what each role may do on each table, however the database was set up ------------------

# The grants of deploy/README.md's roles table, table by table: privileges on the whole table,
# or on the columns in brackets. A role not named for a table has nothing on it.
_ENQUEUED = (
    "id job_type payload run_at idempotency_key max_attempts priority tenant_id queue"
    " result_id run_after traceparent tracestate unique_key created_at updated_at batch_id"
)
_OPERATOR_READS = (
    "id definition_id job_type tenant_id scheduled_for run_at status attempts max_attempts"
    " priority locked_by locked_until last_error error_type started_at finished_at created_at"
    " updated_at batch_id"
)
_OPERATOR_WRITES = (
    "status attempts run_at finished_at locked_by locked_until lease_token updated_at"
)
GRANTS: dict[str, dict[str, str]] = {
    "jobrunner_migrations": {role: "SELECT" for role in ROLES[1:]},
    "job_runs": {
        WORKER: "SELECT INSERT UPDATE DELETE",
        ENQUEUER: f"INSERT({_ENQUEUED})",
        READER: "SELECT",
        OPERATOR: f"SELECT({_OPERATOR_READS}) UPDATE({_OPERATOR_WRITES}) DELETE",
    },
    "job_attempts": {WORKER: "SELECT INSERT", READER: "SELECT", OPERATOR: "INSERT"},
    "job_definitions": {
        WORKER: "SELECT UPDATE",
        READER: "SELECT",
        OPERATOR: "SELECT INSERT UPDATE DELETE",
    },
    "job_effects": {
        WORKER: "SELECT INSERT UPDATE DELETE",
        OPERATOR: "SELECT(key run_id created_at) UPDATE(created_at) DELETE",
    },
    "job_type_pauses": {WORKER: "SELECT", READER: "SELECT", OPERATOR: "SELECT INSERT DELETE"},
    "job_type_limits": {
        WORKER: "SELECT",
        READER: "SELECT",
        OPERATOR: "SELECT INSERT UPDATE DELETE",
    },
    "job_rate_arrivals": {
        WORKER: "SELECT INSERT UPDATE",
        READER: "SELECT",
        OPERATOR: "SELECT DELETE",
    },
    "job_audit": {READER: "SELECT", OPERATOR: "SELECT(id) INSERT"},
    "job_audit_batches": {READER: "SELECT", OPERATOR: "INSERT"},
    "job_run_tally": {WORKER: "SELECT INSERT DELETE", READER: "SELECT"},
    "job_schedule_skips": {WORKER: "SELECT INSERT DELETE", READER: "SELECT"},
    "job_schedule_health": {WORKER: "SELECT", READER: "SELECT"},
    "job_run_logs": {WORKER: "SELECT INSERT", READER: "SELECT"},
    "job_handlers_seen": {WORKER: "SELECT INSERT UPDATE DELETE", READER: "SELECT"},
    "job_batches": {
        WORKER: "SELECT INSERT DELETE",
        ENQUEUER: "INSERT(id on_outcome then_type then_payload then_tenant_id then_priority"
        " then_max_attempts created_at)",
        READER: "SELECT",
        OPERATOR: "SELECT DELETE",
    },
    "job_run_dependencies": {WORKER: "SELECT", READER: "SELECT", OPERATOR: "SELECT"},
    "job_ticks": {WORKER: "SELECT INSERT UPDATE DELETE", READER: "SELECT"},
}
# The functions that act as the owner and that a role may call, and who may.
CALLABLE = {
    "jobrunner_runs_holding_keys": {WORKER, ENQUEUER},
    "jobrunner_replace_waiting": {WORKER, ENQUEUER},
    "jobrunner_batch_end": {WORKER, ENQUEUER},
    "jobrunner_runs_unknown": {WORKER, ENQUEUER},
    "jobrunner_runs_wait": {WORKER, ENQUEUER},
    "jobrunner_run_decide_waiting": set(),  # a parent's finish calls it, as the owner
}
_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
_COLUMN_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "REFERENCES")


def _grants_shown(text: str) -> dict[str, frozenset[str] | None]:
    """'SELECT(a b) DELETE' as {privilege: its columns, or None for the whole table}."""
    return {
        privilege: frozenset(columns.split()) if columns else None
        for privilege, columns in re.findall(r"(\w+)(?:\(([^)]*)\))?", text)
    }


def grants_held(url: str) -> dict[str, dict[str, dict[str, frozenset[str] | None]]]:
    """What each role but the owner may do on each table of the database's public schema,
    as the server answers has_table_privilege and has_column_privilege."""
    held: dict[str, dict[str, dict[str, frozenset[str] | None]]] = {}
    with psycopg.connect(url) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace"
            " AND relkind IN ('r', 'p') ORDER BY 1"
        )]  # fmt: skip
        for table, role, privilege in itertools.product(tables, ROLES[1:], _PRIVILEGES):
            params = {"role": f"jobrunner_{role}", "table": table, "privilege": privilege}
            whole = conn.execute(
                "SELECT has_table_privilege(%(role)s, %(table)s, %(privilege)s)", params
            ).fetchone()[0]
            columns = []
            if not whole and privilege in _COLUMN_PRIVILEGES:
                columns = conn.execute(
                    "SELECT array_agg(attname) FROM pg_attribute"
                    " WHERE attrelid = %(table)s::regclass AND attnum > 0 AND NOT attisdropped"
                    " AND has_column_privilege(%(role)s, attrelid, attnum, %(privilege)s)",
                    params,
                ).fetchone()[0]
            if whole or columns:
                mine = held.setdefault(table, {}).setdefault(role, {})
                mine[privilege] = None if whole else frozenset(columns)
    return held


def test_each_role_holds_exactly_its_grants_on_every_table(each_world: World) -> None:
    expected = {
        table: {role: _grants_shown(text) for role, text in roles.items()}
        for table, roles in GRANTS.items()
    }
    assert grants_held(each_world.db.admin) == expected


def test_only_the_roles_that_enqueue_call_the_functions_that_act_as_the_owner(
    each_world: World,
) -> None:
    with psycopg.connect(each_world.db.admin) as conn:
        callable_by = {
            name: {role for role in ROLES[1:] if conn.execute(
                "SELECT has_function_privilege(%s, oid, 'EXECUTE') FROM pg_proc WHERE oid = %s",
                [f"jobrunner_{role}", oid],
            ).fetchone()[0]}
            for name, oid in conn.execute(
                "SELECT proname, oid FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
                " AND prosecdef AND prorettype <> 'trigger'::regtype"
            )
        }  # fmt: skip
    assert callable_by == CALLABLE


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


def test_the_enqueuer_makes_batches_the_worker_ends_them_and_the_reader_sees_them(
    world: World,
) -> None:
    from cronjob import store
    from cronjob.api import enqueue_batch, new_run

    with psycopg.connect(world.logins[ENQUEUER]) as conn:
        empty = enqueue_batch(conn, [], then=new_run("test.ok"))
        batch = enqueue_batch(conn, [new_run("test.ok"), new_run("test.ok")], then=new_run("x"))
    assert refused(world.logins[ENQUEUER], "SELECT id FROM job_batches")
    ticked = as_role(
        world, WORKER, "tick", "--handlers", "tests.handlers.basic", "--types", "test.ok"
    )
    assert ticked.exit_code == 0, ticked.stderr
    with psycopg.connect(world.logins[READER]) as conn:
        assert store.batch_get(conn, empty.id).callback_run_id is not None
        ended = store.batch_get(conn, batch.id)
    assert ended.counts == {"succeeded": 2}
    assert ended.callback_run_id is not None


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


def test_the_enqueuer_reads_no_run_not_even_its_id_key_tenant_or_result_id(world: World) -> None:
    url = world.logins[ENQUEUER]
    world.run(tenant_id="acme", idempotency_key="secret-key", result_id=str(uuid.uuid4()))

    for column in ("id", "job_type", "tenant_id", "idempotency_key", "unique_key", "result_id"):
        assert refused(url, f"SELECT {column} FROM job_runs"), column
    assert refused(url, "SELECT created_at, finished_at FROM job_runs")
    assert refused(url, "SELECT count(*) FROM job_runs WHERE tenant_id = 'acme'")


def test_the_enqueuer_learns_only_the_run_that_holds_a_key_it_names(world: World) -> None:
    result_id = uuid.uuid4()
    run_id = int(world.run(tenant_id="acme", idempotency_key="K-named", result_id=str(result_id)))
    ask = "SELECT place, id, result_id FROM jobrunner_runs_holding_keys(%s, %s, %s, %s)"

    with psycopg.connect(world.logins[ENQUEUER]) as conn:
        named = conn.execute(ask, [["test.ok"], ["acme"], ["K-named"], [None]]).fetchall()
        other_tenant = conn.execute(ask, [["test.ok"], ["other"], ["K-named"], [None]]).fetchall()
        other_key = conn.execute(ask, [["test.ok"], ["acme"], ["K-other"], [None]]).fetchall()

    assert named == [(1, run_id, result_id)]
    assert other_tenant == other_key == []


# What the review's enqueuer login sent, in psql, to a waiting run of another tenant's.
_REWRITTEN = json.dumps({"amount": 999999, "to": "acct-attacker"})
_REPLACE_WAITING = (
    "SELECT jobrunner_replace_waiting(%s::bigint[], %s::text[], %s::text[], %s::text[],"
    " %s::text[], %s::timestamptz[])"
)


def _attempt(url: str, statement: str, *params: Any) -> None:
    """Run `statement` as the login of `url`; a refusal, or no such function, is fine."""
    refusals = (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedFunction)
    with psycopg.connect(url, autocommit=True) as conn, contextlib.suppress(*refusals):
        conn.execute(statement, params or None)


def _payload_and_run_at(world: World, run_id: str) -> tuple[Any, ...]:
    with psycopg.connect(world.db.admin) as conn:
        query = "SELECT payload, run_at FROM job_runs WHERE id = %s"
        return conn.execute(query, [run_id]).fetchone()


def test_the_enqueuer_cannot_rewrite_another_tenants_waiting_run(world: World) -> None:
    victim = world.run(
        job_type="billing.refund",
        tenant_id="victim",
        unique_key="refund:42",
        payload={"amount": 10, "to": "acct-victim"},
    )
    before = _payload_and_run_at(world, victim)
    url = world.logins[ENQUEUER]

    # As migration 0021 had it: the run's id and unique key were all it asked for.
    _attempt(
        url,
        "SELECT jobrunner_replace_waiting("
        "%s::bigint[], %s::text[], %s::jsonb[], %s::timestamptz[])",
        [int(victim)], ["refund:42"], [_REWRITTEN], ["infinity"],
    )  # fmt: skip
    # As it is now: another type or tenant than the run's, or the run's own, which another
    # login enqueued.
    for job_type, tenant in (("mine", "attacker"), ("billing.refund", "attacker"),
                             ("billing.refund", "victim")):  # fmt: skip
        _attempt(
            url,
            _REPLACE_WAITING,
            [int(victim)], [job_type], [tenant], ["refund:42"], [_REWRITTEN], ["infinity"],
        )  # fmt: skip

    assert _payload_and_run_at(world, victim) == before


def test_a_debounce_rewrites_only_a_run_that_its_own_login_enqueued(world: World) -> None:
    from cronjob.api import enqueue

    def debounce(url: str, value: int) -> int:
        with psycopg.connect(url) as conn:
            return enqueue(
                conn, "digest", {"v": value}, tenant_id="acme", unique_key="U", replace=True
            )

    first, mine = world.logins[ENQUEUER], world.db.login("jobrunner_enqueuer")
    run_id = debounce(first, 1)

    assert debounce(mine, 2) == run_id  # the key's run, left as it was
    assert _payload_and_run_at(world, str(run_id))[0] == {"v": 1}
    assert debounce(first, 3) == run_id
    assert _payload_and_run_at(world, str(run_id))[0] == {"v": 3}
    # A handler's follow-up, as the worker, which may rewrite any payload.
    assert debounce(world.logins[WORKER], 4) == run_id
    assert _payload_and_run_at(world, str(run_id))[0] == {"v": 4}


def test_a_debounce_keeps_run_at_in_the_accepted_range_and_refuses_a_poison_payload(
    world: World,
) -> None:
    from cronjob.api import enqueue

    url = world.logins[ENQUEUER]
    with psycopg.connect(url) as conn:
        run_id = enqueue(conn, "digest", {"v": 1}, tenant_id="acme", unique_key="range")
    replace = _REPLACE_WAITING
    key = ([run_id], ["digest"], ["acme"], ["range"])

    _attempt(url, replace, *key, ['{"v": 2}'], ["infinity"])
    payload, run_at = _payload_and_run_at(world, str(run_id))
    assert (payload, run_at) == ({"v": 2}, datetime(9000, 1, 1, tzinfo=UTC))
    _attempt(url, replace, *key, ['{"v": 3}'], ["-infinity"])
    assert _payload_and_run_at(world, str(run_id))[1] == datetime(1900, 1, 1, tzinfo=UTC)

    deep = "[" * 65 + "]" * 65
    large = json.dumps({"blob": "x" * 1_000_000})
    for payload, message in ((deep, "nested deeper than 64"), (large, "too large")):
        with psycopg.connect(url) as conn, pytest.raises(psycopg.Error, match=message):
            conn.execute(replace, [*key, [payload], [None]])
    assert _payload_and_run_at(world, str(run_id))[0] == {"v": 3}


def test_the_enqueuer_enqueues_with_keys_through_every_python_door(world: World) -> None:
    from cronjob.api import enqueue, enqueue_async, enqueue_many, new_run

    url = world.logins[ENQUEUER]
    with psycopg.connect(url) as conn:
        keyed = enqueue(conn, "door", idempotency_key="I", tenant_id="acme")
        unique = enqueue(conn, "door", unique_key="U", tenant_id="acme")
        assert enqueue(conn, "door", idempotency_key="I", tenant_id="acme") == keyed
        assert enqueue(conn, "door", unique_key="U", tenant_id="acme") == unique
        many = enqueue_many(
            conn,
            [
                new_run("door", idempotency_key="I", tenant_id="acme"),
                new_run("door", idempotency_key="J", tenant_id="acme"),
                new_run("door", idempotency_key="J", tenant_id="acme"),
                new_run("door", unique_key="U", tenant_id="acme"),
                new_run("door", idempotency_key="B", unique_key="U", tenant_id="other"),
            ],
        )

    async def from_async() -> list[int]:
        async with await psycopg.AsyncConnection.connect(url) as aconn:
            return [
                await enqueue_async(aconn, "door", idempotency_key=key, tenant_id="acme")
                for key in ("I", "async", "async")
            ]

    assert many[:4] == [keyed, many[1], many[1], unique] and many[4] not in many[:4]
    found = asyncio.run(from_async())
    assert found[0] == keyed and found[1] == found[2] not in (keyed, unique, *many)


def test_the_worker_keeps_no_run_log_for_an_attempt_never_made(world: World) -> None:
    waiting = world.run()
    ran_once = world.run(status="dead", attempts=1)
    log = (
        "INSERT INTO job_run_logs (run_id, attempt, worker, outcome, events)"
        " VALUES (%s, %s, 'w', 'succeeded', '[]')"
    )

    for run_id, attempt in ((waiting, 1), (ran_once, 2), (ran_once, 0)):
        with psycopg.connect(world.logins[WORKER]) as conn, pytest.raises(psycopg.Error):
            conn.execute(log, [run_id, attempt])
    with psycopg.connect(world.logins[WORKER]) as conn:
        conn.execute(log, [ran_once, 1])
    with psycopg.connect(world.db.admin) as conn:
        kept = conn.execute(
            "SELECT run_id, attempt FROM job_run_logs WHERE run_id = ANY(%s)",
            [[int(waiting), int(ran_once)]],
        ).fetchall()
    assert kept == [(int(ran_once), 1)]


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
    batch = world.batch()
    pages = (
        "/", "/runs", f"/runs/{run_id}", "/schedules", f"/schedules/{schedule}", "/audit",
        "/batches", f"/batches/{batch}", f"/runs?batch={batch}",
    )  # fmt: skip

    with serving(app(world.logins[READER], show_payloads=True)) as base:
        answers = {page: request(base + page) for page in pages}

    assert {page: answer.status for page, answer in answers.items()} == dict.fromkeys(pages, 200)
    assert "ada@example.com" in answers[f"/runs/{run_id}"].body


def test_a_reader_who_does_not_operate_cannot_act_from_the_dashboard(world: World) -> None:
    pytest.importorskip("starlette")
    from cronjob.web import app
    from tests.web_server import cookie_pair, request, serving

    run_id = world.run(status="dead", attempts=1)
    login = "a-login-token-for-the-tests"
    dashboard = app(world.logins[READER], allow_actions=True, login_token=login)
    with serving(dashboard) as base:
        session = cookie_pair(request(f"{base}/?token={login}"), "jobrunner_session")
        page = request(f"{base}/runs/{run_id}", headers={"Cookie": session})
        cookie = cookie_pair(page, "jobrunner_csrf")
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.body).group(1)
        answer = request(
            f"{base}/actions/runs/{run_id}",
            method="POST",
            form={"command": "retry", "csrf_token": token},
            headers={"Cookie": f"{cookie}; {session}"},
        )

    assert answer.status == 403
    assert "permission denied" in answer.body
    with psycopg.connect(world.db.admin) as conn:
        status = conn.execute("SELECT status FROM job_runs WHERE id = %s", (run_id,)).fetchone()
    assert status == ("dead",)
