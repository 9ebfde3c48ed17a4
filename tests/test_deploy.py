"""The deployment examples in deploy/: they load where they are meant to, keep ticks
overlap-safe and drainable, and roles.sql really confines the worker on a real server.

The roles tests use a superuser URL from JOBRUNNER_TEST_DATABASE_URL when one is given, and
otherwise start a throwaway PostgreSQL cluster from the binaries on this machine.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import pytest

from tests.conftest import run_cli

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"

# `jobrunner tick --grace` default: how long running handlers get after SIGTERM. Every
# platform's stop timeout must leave room for it.
TICK_GRACE_SECONDS = 25
TIMERS = ("jobrunner@even.timer", "jobrunner@odd.timer")


# --- systemd -----------------------------------------------------------------------------


def unit_settings(path: Path) -> dict[str, dict[str, str]]:
    """Section -> key -> value; a repeated key keeps its last value, as systemd does."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
        else:
            key, _, value = line.partition("=")
            current[key.strip()] = value.strip()
    return sections


def seconds(value: str) -> int:
    match = re.fullmatch(r"(\d+)\s*(s|sec|min|m|h)?", value)
    assert match, f"unexpected time span {value!r}"
    return int(match.group(1)) * {"min": 60, "m": 60, "h": 3600}.get(match.group(2), 1)


def test_systemd_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    true = shutil.which("true") or "/bin/true"
    # verify insists that ExecStart's binary exists; the venv is not installed here.
    service = (DEPLOY / "jobrunner@.service").read_text()
    service, replaced = re.subn(r"(?m)^ExecStart=.*$", f"ExecStart={true}", service)
    assert replaced == 1
    (tmp_path / "jobrunner@.service").write_text(service)
    for timer in TIMERS:
        shutil.copy(DEPLOY / timer, tmp_path / timer)

    result = subprocess.run(
        [analyze, "verify", "jobrunner@even.service", "jobrunner@odd.service", *TIMERS],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )

    # Unknown keys and unparsable values are only warnings (exit 0), so read the output too.
    complaints = [
        line for line in (result.stdout + result.stderr).splitlines() if "jobrunner" in line
    ]
    assert result.returncode == 0, result.stderr
    assert complaints == []


def test_service_gives_the_tick_its_grace_before_sigkill() -> None:
    service = unit_settings(DEPLOY / "jobrunner@.service")["Service"]

    assert service["Type"] == "oneshot"
    assert service["ExecStart"].endswith("/jobrunner tick --listen")
    assert service["EnvironmentFile"] == "/etc/jobrunner.env"
    assert service["KillSignal"] == "SIGTERM"
    assert service["SuccessExitStatus"] == "143"  # stopped while it listened
    assert seconds(service["TimeoutStopSec"]) > TICK_GRACE_SECONDS
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"


def test_two_timers_start_a_listening_tick_every_minute_each_instance_every_other() -> None:
    calendars = {t: unit_settings(DEPLOY / t)["Timer"]["OnCalendar"] for t in TIMERS}
    assert calendars == {
        "jobrunner@even.timer": "*-*-* *:00/2:00",
        "jobrunner@odd.timer": "*-*-* *:01/2:00",
    }
    for timer in TIMERS:
        settings = unit_settings(DEPLOY / timer)["Timer"]
        assert settings["AccuracySec"] == "1s"
        assert settings["Persistent"] == "false"
        assert "Unit" not in settings  # each starts the service instance of its own name
    # A tick stays to the end of its minute and 10s into the next, then --grace at most:
    # an instance's tick is gone before the same instance starts again two minutes on.
    assert 60 + 10 + TICK_GRACE_SECONDS < 120


# --- Kubernetes --------------------------------------------------------------------------


def manifests() -> dict[str, dict]:
    yaml = pytest.importorskip("yaml")
    documents: dict[str, dict] = {}
    for name in ("kubernetes-cronjob.yaml", "kubernetes-migrate-job.yaml"):
        for document in yaml.safe_load_all((DEPLOY / name).read_text()):
            if document is not None:
                documents[document["kind"]] = document
    return documents


def test_kubernetes_manifests_parse_into_the_expected_objects() -> None:
    assert sorted(manifests()) == ["ConfigMap", "CronJob", "Job"]


def test_cronjob_lets_ticks_overlap_and_drain_gracefully() -> None:
    cronjob = manifests()["CronJob"]["spec"]
    job = cronjob["jobTemplate"]["spec"]
    pod = job["template"]["spec"]

    assert cronjob["schedule"] == "* * * * *"
    assert cronjob["concurrencyPolicy"] == "Allow"
    assert 0 < cronjob["startingDeadlineSeconds"] < 60
    assert job["backoffLimit"] == 0
    assert job["activeDeadlineSeconds"] > 60
    assert pod["restartPolicy"] == "Never"
    assert pod["terminationGracePeriodSeconds"] > TICK_GRACE_SECONDS
    # A listening tick overlaps the next minute's (started up to 25s late), and is gone,
    # its grace spent, before the pod of the minute after next starts.
    command = pod["containers"][0]["command"]
    runtime = int(command[command.index("--max-runtime") + 1].rstrip("s"))
    assert runtime >= 60 + 25 and runtime + TICK_GRACE_SECONDS < 120


def secret_url_file(pod: dict) -> tuple[str, str]:
    """The Secret and key the pod's JOBRUNNER_DATABASE_URL_FILE names a mounted file of."""
    container = pod["containers"][0]
    env = {item["name"]: item for item in container["env"]}
    assert "JOBRUNNER_DATABASE_URL" not in env  # the URL itself stays out of the environment
    path = Path(env["JOBRUNNER_DATABASE_URL_FILE"]["value"])
    (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    (item,) = [i for i in volume["secret"]["items"] if i["path"] == path.name]
    return volume["secret"]["secretName"], item["key"]


def test_cronjob_reads_the_url_from_a_secret_file_and_handlers_from_a_configmap() -> None:
    documents = manifests()
    pod = documents["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    container = pod["containers"][0]

    assert container["command"] == ["jobrunner", "tick", "--listen", "--max-runtime", "85s"]
    assert secret_url_file(pod) == ("jobrunner-database", "worker-url")
    assert container["envFrom"] == [
        {"configMapRef": {"name": documents["ConfigMap"]["metadata"]["name"]}}
    ]
    assert "JOBRUNNER_HANDLERS" in documents["ConfigMap"]["data"]
    assert set(container["resources"]) == {"requests", "limits"}


def test_migrate_job_runs_migrate_with_the_owner_login() -> None:
    documents = manifests()
    migrate = documents["Job"]["spec"]["template"]["spec"]
    tick = documents["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]

    assert migrate["containers"][0]["command"] == ["jobrunner", "migrate"]
    assert migrate["restartPolicy"] == "Never"
    assert secret_url_file(migrate) == ("jobrunner-database", "owner-url")
    assert secret_url_file(migrate) != secret_url_file(tick)


# --- cron --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CronEntry:
    schedule: str
    user: str
    command: str


def jobrunner_args(entry: CronEntry) -> str:
    match = re.search(r"/jobrunner (.+?) 2>&1", entry.command)
    assert match, f"no jobrunner call with its output captured: {entry.command!r}"
    return match.group(1)


def crontab_entries() -> list[CronEntry]:
    entries = []
    for raw in (DEPLOY / "crontab").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", line):
            continue
        fields = line.split(None, 6)
        assert len(fields) == 7, f"not 5 fields, a user and a command: {line!r}"
        entries.append(CronEntry(" ".join(fields[:5]), fields[5], fields[6]))
    return entries


def test_crontab_lines_are_five_fields_a_user_and_a_command() -> None:
    croniter = pytest.importorskip("croniter")
    entries = crontab_entries()

    assert [jobrunner_args(entry).split()[0] for entry in entries] == ["tick", "check", "prune"]
    for entry in entries:
        assert croniter.croniter.is_valid(entry.schedule), entry.schedule
        assert re.fullmatch(r"[a-z_][a-z0-9_-]*", entry.user)
        # cron turns an unescaped % into a newline.
        assert re.search(r"(?<!\\)%", entry.command) is None, entry.command
    assert entries[0].schedule == "* * * * *"
    assert jobrunner_args(entries[0]) == "tick --listen"


def run_cron_command(entry: CronEntry, tmp_path: Path, *, exit_code: int) -> tuple[str, str]:
    """Run an entry's command as cron would, against a stub jobrunner and a stub logger.

    Returns what cron would mail (the command's output) and what reached syslog.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls, syslog = tmp_path / "calls", tmp_path / "syslog"
    stub = bin_dir / "jobrunner"
    stub.write_text(
        "#!/bin/sh\n"
        f'echo "$* url=$JOBRUNNER_DATABASE_URL handlers=$JOBRUNNER_HANDLERS" >> {calls}\n'
        'echo "{\\"event\\": \\"stub\\"}" >&2\n'
        f"exit {exit_code}\n"
    )
    logger = bin_dir / "logger"
    logger.write_text(f'#!/bin/sh\necho "[$*]" >> {syslog}\ncat >> {syslog}\n')
    for script in (stub, logger):
        script.chmod(0o755)
    env_file = tmp_path / "jobrunner.env"
    shutil.copy(DEPLOY / "jobrunner.env.example", env_file)

    command = (
        entry.command.replace("\\%", "%")
        .replace("/etc/jobrunner.env", str(env_file))
        .replace("/opt/app/venv/bin/jobrunner", str(stub))
    )
    result = subprocess.run(
        ["/bin/sh", "-c", command],
        check=False,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=10,
    )
    call = calls.read_text()
    assert call.startswith(jobrunner_args(entry) + " url=postgresql://")
    assert "handlers=myapp.jobs,myapp.reports" in call
    return result.stdout + result.stderr, syslog.read_text() if syslog.exists() else ""


@pytest.mark.parametrize("command", ["tick", "prune"])
def test_crontab_tick_and_prune_load_the_env_file_and_log_to_syslog(
    tmp_path: Path, command: str
) -> None:
    entry = next(e for e in crontab_entries() if jobrunner_args(e).startswith(command))

    mailed, syslog = run_cron_command(entry, tmp_path, exit_code=0)

    assert mailed == ""
    assert syslog.splitlines() == ["[-t jobrunner]", '{"event": "stub"}']


@pytest.mark.parametrize("exit_code", [0, 1])
def test_crontab_check_mails_only_when_a_threshold_is_breached(
    tmp_path: Path, exit_code: int
) -> None:
    check = crontab_entries()[1]

    mailed, _ = run_cron_command(check, tmp_path, exit_code=exit_code)

    assert mailed == ('{"event": "stub"}\n' if exit_code else "")


# --- roles.sql on a real server ----------------------------------------------------------


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"/postgresql/(\d+)", path))


def psql_binary() -> str | None:
    found = shutil.which("psql")
    if found:
        return found
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"), key=_version_key)
    return candidates[-1] if candidates else None


PSQL = psql_binary()


def psql(url: str, *statements: str, options: Sequence[str] = (), check: bool = True):
    """Run each statement (a `-c`) in order, stopping at the first error."""
    command = [PSQL or "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, *options]
    for statement in statements:
        command += ["-c", statement]
    result = subprocess.run(
        command,
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PGCONNECT_TIMEOUT": "5"},
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def scalar(url: str, statement: str) -> str:
    return psql(url, statement, options=["-tA"]).stdout.strip()


def with_login(base_url: str, *, user: str, dbname: str, password: str | None = None) -> str:
    """`base_url` with another user, password and database; host, port and options kept."""
    parts = urlsplit(base_url)
    userinfo = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "")
    hostport = parts.netloc.rpartition("@")[2]
    path = "/" + quote(dbname)
    return urlunsplit((parts.scheme, f"{userinfo}@{hostport}", path, parts.query, ""))


@dataclass(frozen=True)
class Server:
    admin_url: str

    def url(self, dbname: str, user: str | None = None, password: str | None = None) -> str:
        if user is None:
            admin = urlsplit(self.admin_url)
            user = unquote(admin.username or "postgres")
            password = unquote(admin.password) if admin.password else None
        return with_login(self.admin_url, user=user, dbname=dbname, password=password)


def is_superuser(url: str) -> bool:
    result = psql(
        url,
        "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
        options=["-tA"],
        check=False,
    )
    return result.returncode == 0 and result.stdout.strip() == "t"


def throwaway_cluster() -> Iterator[str]:
    """Start a private cluster on a Unix socket, no TCP; yields its superuser URL."""
    bindirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key)
    on_path = shutil.which("initdb")
    if on_path:
        bindirs.append(str(Path(on_path).parent))
    bindir = next((Path(d) for d in reversed(bindirs) if (Path(d) / "pg_ctl").exists()), None)
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries and no JOBRUNNER_TEST_DATABASE_URL")

    run_as: list[str] = []
    owner: pwd.struct_passwd | None = None
    if os.geteuid() == 0:
        # The server refuses to run as root: borrow an existing unprivileged account.
        for name in ("postgres", "nobody"):
            try:
                owner = pwd.getpwnam(name)
                break
            except KeyError:
                continue
        runuser = shutil.which("runuser")
        if runuser is None or owner is None:
            pytest.skip("running as root without runuser or an unprivileged account")
        run_as = [runuser, "-u", owner.pw_name, "--"]

    # Directly in the system temp dir: pytest's own is private to root.
    root = Path(tempfile.mkdtemp(prefix="jobrunner-pg-"))
    if owner is not None:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    data, log = root / "data", root / "server.log"

    def pg(*command: str | Path, check: bool = True) -> None:
        result = subprocess.run(
            [*run_as, *map(str, command)],
            check=False,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
        )
        server_log = log.read_text() if log.exists() else ""
        assert result.returncode == 0 or not check, result.stdout + result.stderr + server_log

    try:
        initdb = ["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"]
        pg(bindir / "initdb", "-D", data, *initdb)
        settings = f"-c listen_addresses='' -k {root} -c fsync=off -c full_page_writes=off"
        pg(bindir / "pg_ctl", "-D", data, "-l", log, "-w", "-o", settings, "start")
        yield f"postgresql://postgres@/postgres?host={quote(str(root), safe='')}"
    finally:
        if (data / "postmaster.pid").exists():
            pg(bindir / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    if PSQL is None:
        pytest.skip("psql is not installed")
    given = os.environ.get("JOBRUNNER_TEST_DATABASE_URL")
    if given and is_superuser(given):
        groups_existed = scalar(
            given,
            "SELECT count(*) > 0 FROM pg_roles "
            "WHERE rolname IN ('jobrunner_owner', 'jobrunner_worker')",
        )
        yield Server(given)
        # The throwaway databases that held their grants are gone by now.
        if groups_existed == "f":
            psql(given, "DROP ROLE IF EXISTS jobrunner_worker, jobrunner_owner", check=False)
        return
    cluster = throwaway_cluster()
    yield Server(next(cluster))
    cluster.close()


@dataclass(frozen=True)
class Database:
    server: Server
    name: str
    logins: list[str]

    @property
    def admin(self) -> str:
        return self.server.url(self.name)

    def roles_sql(self, schema: str = "public") -> None:
        psql(self.admin, options=["-v", f"schema={schema}", "-f", str(DEPLOY / "roles.sql")])

    def login(self, group: str, *, search_path: str | None = None) -> str:
        """A LOGIN user in `group`, made as roles.sql's header says; returns its URL."""
        name = f"jr_test_{group.removeprefix('jobrunner_')}_{secrets.token_hex(4)}"
        password = secrets.token_hex(16)
        statements = [f"CREATE ROLE {name} LOGIN PASSWORD '{password}' IN ROLE {group}"]
        if group == "jobrunner_owner":
            statements.append(f"ALTER ROLE {name} SET role = 'jobrunner_owner'")
        if search_path:
            statements.append(
                f"ALTER ROLE {name} IN DATABASE {self.name} SET search_path = {search_path}"
            )
        self.logins.append(name)
        psql(self.admin, *statements)
        return self.server.url(self.name, name, password)


@contextmanager
def throwaway_database(server: Server) -> Iterator[Database]:
    name = f"jobrunner_roles_{secrets.token_hex(4)}"
    psql(server.url("postgres"), f"CREATE DATABASE {name}")
    database = Database(server, name, [])
    try:
        yield database
    finally:
        psql(server.url("postgres"), f"DROP DATABASE {name} WITH (FORCE)")
        for login in database.logins:
            psql(server.url("postgres"), f"DROP ROLE {login}")


@pytest.fixture
def db(server: Server) -> Iterator[Database]:
    with throwaway_database(server) as database:
        yield database


# As `jobrunner migrate` creates it.
MIGRATIONS_TABLE = (
    "CREATE TABLE IF NOT EXISTS jobrunner_migrations ("
    " version integer PRIMARY KEY, name text NOT NULL,"
    " applied_at timestamptz NOT NULL DEFAULT now())"
)


def migrate(url: str, *, through: int | None = None) -> None:
    """What `jobrunner migrate` does, by hand: every shipped migration (up to version
    `through`), and its record; in one transaction, but for those whose first line asks to
    run outside one, which psql runs a statement at a time between the transactions before
    and after them."""
    from cronjob.migrate import NO_TRANSACTION

    batch = ["-c", MIGRATIONS_TABLE]
    for path in sorted((REPO / "sql").glob("[0-9][0-9][0-9][0-9]_*.sql")):
        version, _, name = path.stem.partition("_")
        if through is not None and int(version) > through:
            break
        record = f"INSERT INTO jobrunner_migrations VALUES ({int(version)}, '{name}')"
        if path.read_text().startswith(NO_TRANSACTION):
            if batch:
                psql(url, options=["-1", *batch])
            psql(url, options=["-f", str(path), "-c", record])
            batch = []
        else:
            batch += ["-f", str(path), "-c", record]
    if batch:
        psql(url, options=["-1", *batch])


def assert_worker_can_use(url: str, table: str = "job_runs") -> None:
    psql(
        url,
        f"INSERT INTO {table} (job_type) VALUES ('probe')",
        f"SELECT count(*) FROM {table}",
        f"UPDATE {table} SET job_type = 'probed'",
        f"DELETE FROM {table}",
    )


def assert_denied(url: str, statement: str) -> None:
    result = psql(url, statement, check=False)
    assert result.returncode != 0, f"the worker was allowed: {statement}"
    assert re.search(r"permission denied|must be owner", result.stderr), result.stderr


@dataclass(frozen=True)
class Migrated:
    db: Database
    owner: str
    worker: str


@pytest.fixture(scope="module")
def migrated(server: Server) -> Iterator[Migrated]:
    """The documented order: roles.sql, migrate as the owner's login, roles.sql again."""
    with throwaway_database(server) as db:
        db.roles_sql()
        owner = db.login("jobrunner_owner")
        migrate(owner)
        db.roles_sql()
        yield Migrated(db, owner, db.login("jobrunner_worker"))


def test_roles_sql_is_idempotent_and_creates_nologin_groups(db: Database) -> None:
    db.roles_sql()
    db.roles_sql()

    groups = scalar(
        db.admin,
        "SELECT string_agg(rolname || ' login=' || rolcanlogin, ', ' ORDER BY rolname) "
        "FROM pg_roles WHERE rolname LIKE 'jobrunner\\_%'",
    )
    assert groups == (
        "jobrunner_enqueuer login=false, jobrunner_operator login=false, "
        "jobrunner_owner login=false, jobrunner_reader login=false, "
        "jobrunner_worker login=false"
    )


def test_worker_gets_what_a_tick_needs_and_no_more_from_migrate_after_roles_sql(
    db: Database,
) -> None:
    # roles.sql once, before migrate, and never again (as the Kubernetes manifests have it):
    # the migrations themselves narrow what default privileges gave.
    db.roles_sql()
    migrate(db.login("jobrunner_owner"))

    worker = db.login("jobrunner_worker")

    assert_worker_can_use(worker, "job_runs")
    psql(
        worker,
        "UPDATE job_definitions SET enabled = false",
        "SELECT count(*) FROM job_type_pauses, job_type_limits",
        "SELECT max(version) FROM jobrunner_migrations",
    )
    assert_denied(
        worker, "INSERT INTO job_definitions (name, job_type, schedule) VALUES ('p', 'p', '@daily')"
    )
    assert_denied(worker, "DELETE FROM job_definitions")
    assert_denied(worker, "INSERT INTO job_type_pauses (job_type, paused_by) VALUES ('t', 'w')")
    assert_denied(worker, "DELETE FROM job_type_limits")
    assert_denied(worker, "DELETE FROM job_run_logs")
    assert_denied(worker, "SELECT count(*) FROM job_audit")


def test_the_rate_table_has_each_roles_grants_from_the_migration_that_creates_it(
    db: Database,
) -> None:
    # roles.sql once, before the first migrate, as the Kubernetes flow runs it.
    db.roles_sql()
    migrate(db.login("jobrunner_owner"))
    worker, reader, operator = (
        db.login(f"jobrunner_{role}") for role in ("worker", "reader", "operator")
    )
    key = "'\\x00'::bytea"
    psql(
        worker,
        f"INSERT INTO job_rate_arrivals VALUES ('t', {key}, now())",
        "UPDATE job_rate_arrivals SET next_start = now()",
        "SELECT count(*) FROM job_rate_arrivals",
    )
    assert_denied(worker, "DELETE FROM job_rate_arrivals")
    psql(reader, "SELECT count(*) FROM job_rate_arrivals")
    assert_denied(reader, "DELETE FROM job_rate_arrivals")
    # A limit set or cleared forgets its keys' next starts.
    psql(operator, "DELETE FROM job_rate_arrivals WHERE job_type = 't'")
    assert_denied(operator, f"INSERT INTO job_rate_arrivals VALUES ('u', {key}, now())")


def test_roles_sql_adopts_tables_that_another_role_migrated(db: Database) -> None:
    migrate(db.admin)

    db.roles_sql()

    owners = scalar(
        db.admin,
        "SELECT string_agg(DISTINCT pg_get_userbyid(relowner), ',') FROM pg_class "
        "WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'S')",
    )
    assert owners == "jobrunner_owner"
    # The triggers that act as the owner act as jobrunner_owner, not as the superuser.
    function_owners = scalar(
        db.admin,
        "SELECT string_agg(DISTINCT pg_get_userbyid(proowner), ',') FROM pg_proc "
        "WHERE pronamespace = 'public'::regnamespace AND proname LIKE 'jobrunner%'",
    )
    assert function_owners == "jobrunner_owner"
    assert_worker_can_use(db.login("jobrunner_worker"))


def test_roles_sql_run_again_narrows_the_worker_an_earlier_version_set_up(db: Database) -> None:
    db.roles_sql()
    migrate(db.login("jobrunner_owner"))
    # What roles.sql gave the worker before each job had a role: data access to every table.
    psql(
        db.admin,
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO jobrunner_worker",
    )
    worker = db.login("jobrunner_worker")
    sneaky_schedule = (
        "INSERT INTO job_definitions (name, job_type, schedule) VALUES ('s', 't', '@daily')"
    )
    psql(worker, sneaky_schedule, "DELETE FROM job_definitions")

    db.roles_sql()

    assert_denied(worker, sneaky_schedule)
    assert_denied(worker, "DELETE FROM job_type_pauses")
    assert_denied(worker, "INSERT INTO job_audit (actor, command) VALUES ('x', 'prune')")
    assert_denied(worker, "SELECT count(*) FROM job_audit")
    assert_worker_can_use(worker)


def test_roles_sql_runs_on_a_database_an_earlier_release_migrated(db: Database) -> None:
    # An upgrade may run this release's roles.sql before its migrations: job_runs has no
    # queue column yet (migration 0014), which the enqueuer's grant names.
    db.roles_sql()
    owner = db.login("jobrunner_owner")
    migrate(owner, through=13)

    db.roles_sql()
    migrated = run_cli("migrate", "--database-url", owner)
    assert migrated.exit_code == 0, migrated.stderr
    db.roles_sql()

    may_insert_queue = (
        "SELECT has_column_privilege('jobrunner_enqueuer', 'job_runs', 'queue', 'INSERT')"
    )
    assert scalar(db.admin, may_insert_queue) == "t"


def test_worker_can_use_tables_that_a_later_migration_adds(migrated: Migrated) -> None:
    psql(migrated.owner, "CREATE TABLE job_later_probe (id bigserial PRIMARY KEY, job_type text)")

    assert_worker_can_use(migrated.worker, "job_later_probe")


def test_worker_cannot_change_the_schema(migrated: Migrated) -> None:
    assert_denied(migrated.worker, "CREATE TABLE job_sneaky (id int)")
    assert_denied(migrated.worker, "CREATE TABLE public.job_sneaky (id int)")
    assert_denied(migrated.worker, "DROP TABLE job_runs")
    assert_denied(migrated.worker, "TRUNCATE job_runs")
    assert_denied(migrated.worker, "ALTER TABLE job_runs ADD COLUMN sneaky int")
    assert_denied(migrated.worker, "CREATE INDEX job_runs_sneaky ON job_runs (job_type)")
    assert_denied(migrated.worker, "SELECT setval('job_runs_id_seq', 1)")


def test_worker_reads_but_cannot_rewrite_the_migration_history(migrated: Migrated) -> None:
    assert scalar(migrated.worker, "SELECT count(*) > 0 FROM jobrunner_migrations") == "t"
    assert_denied(migrated.worker, "INSERT INTO jobrunner_migrations VALUES (9999, 'fake')")
    assert_denied(migrated.worker, "DELETE FROM jobrunner_migrations")


def test_roles_sql_takes_the_schema_as_a_variable(db: Database) -> None:
    db.roles_sql(schema="jobs")
    migrate(db.login("jobrunner_owner", search_path="jobs"))
    db.roles_sql(schema="jobs")

    worker = db.login("jobrunner_worker", search_path="jobs")

    assert scalar(db.admin, "SELECT to_regclass('jobs.job_runs') IS NOT NULL") == "t"
    assert_worker_can_use(worker)
    assert_denied(worker, "CREATE TABLE jobs.job_sneaky (id int)")


def test_worker_cannot_rewrite_the_migration_history_before_roles_sql_runs_again(
    db: Database,
) -> None:
    db.roles_sql()
    owner = db.login("jobrunner_owner")
    migrated = run_cli("migrate", "--database-url", owner)
    assert migrated.exit_code == 0, migrated.stderr

    worker = db.login("jobrunner_worker")

    assert_worker_can_use(worker)
    assert scalar(worker, "SELECT count(*) > 0 FROM jobrunner_migrations") == "t"
    assert_denied(worker, "INSERT INTO jobrunner_migrations VALUES (9999, 'fake')")
    assert_denied(worker, "DELETE FROM jobrunner_migrations")
    assert_denied(worker, "UPDATE jobrunner_migrations SET version = version + 100")


def test_worker_cannot_create_in_public_when_jobrunner_lives_in_another_schema(
    db: Database,
) -> None:
    # As a database created before PostgreSQL 15 has it, upgraded or not.
    psql(db.admin, "GRANT CREATE ON SCHEMA public TO PUBLIC")
    db.roles_sql(schema="jobs")
    migrate(db.login("jobrunner_owner", search_path="jobs"))
    db.roles_sql(schema="jobs")

    worker = db.login("jobrunner_worker", search_path="jobs")

    assert_worker_can_use(worker)
    assert_denied(worker, "CREATE TABLE public.job_sneaky (id int)")
