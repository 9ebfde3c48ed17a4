"""Every command through a real PgBouncer in transaction pooling mode.

A private pgbouncer listens on a free localhost port in front of the test server,
with a pool smaller than the number of clients, so server connections really are
shared between ticks, handlers and commands. The test server itself has no TCP
listener of its own in the default setup: whatever reaches it here went through
pgbouncer. Skipped when pgbouncer is not installed (`apt-get install pgbouncer`).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import conninfo

from tests.conftest import count, jobrunner_process, run_cli, wait_for

PGBOUNCER = shutil.which("pgbouncer") or next(
    (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
)
pytestmark = pytest.mark.skipif(
    PGBOUNCER is None, reason="pgbouncer is not installed (apt-get install pgbouncer)"
)

POOL_SIZE = 3
HANDLERS = "tests.handlers.basic,tests.handlers.pooled"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def unprivileged_user(backend_host: str) -> pwd.struct_passwd:
    """pgbouncer refuses to run as root: run it as whoever can reach the server's socket."""
    if backend_host.startswith("/"):
        owner = pwd.getpwuid(os.stat(backend_host).st_uid)
        if owner.pw_uid != 0:
            return owner
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    pytest.skip("running as root with no unprivileged account for pgbouncer")


@pytest.fixture(scope="module")
def pooled_database(server_url: str) -> Iterator[tuple[str, str]]:
    """A fresh, unmigrated database; yields (its URL through pgbouncer, its direct URL)."""
    name = f"jobrunner_test_{os.getpid()}_pgbouncer"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    backend = conninfo.conninfo_to_dict(server_url)
    direct = conninfo.make_conninfo(**{**backend, "dbname": name})
    host = str(backend.get("host") or "/var/run/postgresql")
    user = str(backend.get("user") or pwd.getpwuid(os.getuid()).pw_name)
    target = f"host={host} port={backend.get('port') or 5432} dbname={name} user={user}"
    if backend.get("password"):
        target += f" password={backend['password']}"
    port = free_port()
    # Directly under the system temp dir: pytest's is private to root.
    workdir = Path(tempfile.mkdtemp(prefix="jobrunner-pgbouncer-"))
    (workdir / "userlist.txt").write_text(f'"{user}" ""\n')
    settings = [
        "[databases]",
        f"{name} = {target}",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = trust",
        f"auth_file = {workdir / 'userlist.txt'}",
        "pool_mode = transaction",
        f"default_pool_size = {POOL_SIZE}",
        "max_client_conn = 200",
    ]
    if os.geteuid() == 0:
        account = unprivileged_user(host)
        settings.append(f"user = {account.pw_name}")
        for path in (workdir, *workdir.iterdir()):
            os.chown(path, account.pw_uid, account.pw_gid)
    (workdir / "pgbouncer.ini").write_text("\n".join(settings) + "\n")
    log = (workdir / "pgbouncer.log").open("w")
    bouncer = subprocess.Popen(
        [PGBOUNCER, str(workdir / "pgbouncer.ini")], stdout=log, stderr=subprocess.STDOUT
    )
    url = f"postgresql://{user}@127.0.0.1:{port}/{name}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                psycopg.connect(url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if bouncer.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        f"pgbouncer did not start: {(workdir / 'pgbouncer.log').read_text()}"
                    )
                time.sleep(0.1)
        yield url, direct
    finally:
        bouncer.terminate()
        bouncer.wait(timeout=10)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def jobrunner(url: str, *args: str, expect: int = 0) -> Any:
    result = run_cli(*args, "--database-url", url)
    assert result.exit_code == expect, f"{args}: {result.stdout}{result.stderr}"
    return result


def test_every_command_works_through_pgbouncer_in_transaction_mode(pooled_database, tmp_path):
    url, direct = pooled_database
    jobrunner(url, "migrate")
    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute("CREATE TABLE pooled_effects (n int, run_id bigint)")

    lines = [{"type": "test.ok", "payload": {"i": i}} for i in range(30)]
    lines += [{"type": "pooled.write", "payload": {"n": i % 10}} for i in range(15)]
    lines += [{"type": "test.give_up"} for _ in range(3)]
    lines += [{"type": "test.fail", "max_attempts": 1} for _ in range(3)]
    lines += [{"type": "test.sleep", "payload": {"seconds": 0.3}} for _ in range(2)]
    enqueued = run_cli(
        "enqueue",
        "--jsonl",
        "-",
        "--database-url",
        url,
        input="".join(json.dumps(line) + "\n" for line in lines),
    )
    assert enqueued.exit_code == 0, enqueued.stderr
    ids = [int(i) for i in enqueued.stdout.split()]
    later = int(jobrunner(url, "enqueue", "test.ok", "--delay", "1h").stdout)

    # Two real ticks at once, each with worker threads and handler transactions,
    # sharing POOL_SIZE server connections.
    exec_log = tmp_path / "executions.log"
    ticks = [
        jobrunner_process(
            "tick",
            "--database-url",
            url,
            "--handlers",
            HANDLERS,
            "--concurrency",
            "4",
            "--batch-size",
            "5",
            env={"JOBRUNNER_TEST_EXEC_LOG": str(exec_log)},
        )
        for _ in range(2)
    ]
    for tick in ticks:
        _, stderr = tick.communicate(timeout=60)
        assert tick.returncode == 0, stderr[-2000:]

    executions = Counter(int(line.split()[0]) for line in exec_log.read_text().splitlines())
    assert executions == Counter(ids)  # every due run ran, exactly once
    with psycopg.connect(direct, autocommit=True) as conn:
        statuses = dict(conn.execute("SELECT status, count(*) FROM job_runs GROUP BY status"))
        assert statuses == {"succeeded": 47, "dead": 6, "queued": 1}
        # Ten business keys: the handler's writes committed with its runs, once per key.
        assert count(conn, "SELECT count(DISTINCT n) FROM pooled_effects") == 10
        assert count(conn, "SELECT count(*) FROM pooled_effects") == 10
        # The give_up runs first: the one retried below is one of them.
        dead = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM job_runs WHERE status = 'dead' ORDER BY job_type = 'test.fail', id"
            )
        ]

    _operate_through_the_pooler(url, direct, dead, later)


def _operate_through_the_pooler(url: str, direct: str, dead: list[int], later: int) -> None:
    """retry, cancel, status, list, show, metrics, check and prune, all through PgBouncer."""
    assert jobrunner(url, "retry", str(dead[0])).stdout == f"retried {dead[0]}\n"
    assert jobrunner(url, "cancel", str(later)).stdout == f"cancelled {later}\n"

    status = json.loads(jobrunner(url, "status", "--json").stdout)
    assert status["runs"] == {
        "queued": 1,
        "running": 0,
        "succeeded": 47,
        "failed": 0,
        "dead": 5,
        "cancelled": 1,
        "waiting": 0,
    }
    assert "JOB TYPE" in jobrunner(url, "status").stdout
    listed = json.loads(jobrunner(url, "list", "--status", "dead", "--json").stdout)
    assert sorted(r["id"] for r in listed) == sorted(dead[1:])
    shown = json.loads(jobrunner(url, "show", str(dead[1]), "--json").stdout)
    assert len(shown["attempt_history"]) == 1

    families = {f.name: f for f in text_string_to_metric_families(jobrunner(url, "metrics").stdout)}
    dead_samples = families["jobrunner_dead_runs"].samples
    assert sum(s.value for s in dead_samples) == 5
    breached = jobrunner(url, "check", "--max-dead", "0", "--max-stuck", "0", expect=1)
    assert breached.stdout.splitlines() == [
        "OK max-stuck=0: 0 running run(s) with an expired lease",
        "BREACHED max-dead=0: 5 dead run(s) (test.fail 3, test.give_up 2)",
    ]

    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute(
            "UPDATE job_runs SET finished_at = finished_at - interval '2 days'"
            " WHERE status = 'succeeded'"
        )
    pruned = json.loads(
        jobrunner(url, "prune", "--older-than", "1d", "--batch-size", "10", "--json").stdout
    )
    assert (pruned["total"], pruned["batches"]) == (47, 5)
    with psycopg.connect(direct, autocommit=True) as conn:
        assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'succeeded'") == 0


def test_the_runner_timeouts_stay_off_pooled_connections(pooled_database):
    from cronjob.db import connect

    url, direct = pooled_database
    # pgbouncer refuses the `options` startup parameter: the runner connects without
    # it rather than fail, and issues no SET that would outlive its transaction on a
    # server connection other clients get next.
    with connect(url) as pooled:
        assert pooled.execute("SELECT 1").fetchone()[0] == 1
    with psycopg.connect(url, autocommit=True) as other_client:
        assert other_client.execute("SHOW statement_timeout").fetchone()[0] == "0"
    with connect(direct) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "30s"


def _listening_tick(url: str, direct: str, tmp_path: Path, *args: str) -> Any:
    """A `tick --listen` on a migrated database with no runs left by the tests before."""
    jobrunner(url, "migrate")
    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute("TRUNCATE job_runs, job_ticks CASCADE")
    env = {"JOBRUNNER_TEST_EXEC_LOG": str(tmp_path / "exec.log")}
    command = ("tick", "--listen", "--max-runtime", "6s", "--handlers", "tests.handlers.basic")
    return jobrunner_process(*command, "--database-url", url, *args, env=env)


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if json.loads(line)["level"] == "warning"]


def test_a_listening_tick_behind_pgbouncer_polls_says_why_once_and_runs_everything(
    pooled_database, tmp_path
):
    url, direct = pooled_database
    tick = _listening_tick(url, direct, tmp_path)
    with psycopg.connect(direct, autocommit=True) as conn:
        polling = "SELECT count(*) FROM job_ticks WHERE poll_interval = 1"
        wait_for(lambda: count(conn, polling) == 1, "the tick to poll")
        ids = [int(jobrunner(url, "enqueue", "test.ok").stdout) for _ in range(5)]
        done = "SELECT count(*) FROM job_runs WHERE status = 'succeeded' AND id = ANY(%s)"
        wait_for(lambda: count(conn, done, ids) == len(ids), "the runs to finish")
        waits = conn.execute(
            "SELECT max(extract(epoch FROM started_at - created_at)) FROM job_runs"
        ).fetchone()[0]
    _out, err = tick.communicate(timeout=60)
    assert tick.returncode == 0, err
    warnings = _warnings(err)
    assert len(warnings) == 1, err
    (warning,) = warnings
    assert json.loads(warning)["event"] == (
        "polling every 1s: LISTEN cannot work through a connection pooler"
        " (give --listen-database-url)"
    )
    assert waits < 3  # a poll a second, and a generous margin
    lines = (tmp_path / "exec.log").read_text().splitlines()
    assert Counter(int(line.split()[0]) for line in lines) == dict.fromkeys(ids, 1)


def test_a_listening_tick_given_a_direct_session_listens_beside_pgbouncer(
    pooled_database, tmp_path
):
    url, direct = pooled_database
    tick = _listening_tick(url, direct, tmp_path, "--listen-database-url", direct)
    with psycopg.connect(direct, autocommit=True) as conn:
        listening = "SELECT count(*) FROM job_ticks WHERE listening_since IS NOT NULL"
        wait_for(lambda: count(conn, listening) == 1, "the tick to listen")
        run_id = int(jobrunner(url, "enqueue", "test.ok").stdout)
        started = "SELECT extract(epoch FROM started_at - created_at) FROM job_runs WHERE id = %s"
        waited = wait_for(lambda: conn.execute(started, [run_id]).fetchone()[0], "the run")
    _out, err = tick.communicate(timeout=60)
    assert tick.returncode == 0, err
    assert _warnings(err) == []
    assert waited < 2
