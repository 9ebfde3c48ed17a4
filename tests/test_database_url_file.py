"""Where the database URL comes from: the flags, the environment, and a file either names
(a Docker or Kubernetes secret), which keeps the password out of `ps`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from psycopg import conninfo

from tests.conftest import jobrunner_process, run_cli, wait_for

UNREACHABLE = "postgresql://nobody@127.0.0.1:1/none"
# In the order jobrunner looks: the first one given wins, and the later ones are not read.
SOURCES = [
    "--database-url",
    "--database-url-file",
    "JOBRUNNER_DATABASE_URL",
    "JOBRUNNER_DATABASE_URL_FILE",
    "DATABASE_URL",
]


def url_file(directory: Path, url: str, *, name: str = "database-url", mode: int = 0o600) -> str:
    path = directory / name
    path.write_text(url + "\n")
    path.chmod(mode)
    return str(path)


def given(source: str, url: str, directory: Path) -> tuple[list[str], dict[str, str]]:
    """The arguments and environment that hand `url` to jobrunner through `source`."""
    if source.startswith("--"):
        value = url_file(directory, url, name=source) if source.endswith("file") else url
        return [source, value], {}
    value = url_file(directory, url, name=source) if source.endswith("FILE") else url
    return [], {source: value}


def migrate_source(args: list[str], env: dict[str, str]) -> str:
    """The source `jobrunner migrate` says it used (its log names it)."""
    result = run_cli("migrate", *args, env=env)
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    return next(line["database"] for line in lines if line["event"] == "schema up to date")


@pytest.mark.parametrize("source", SOURCES)
def test_each_source_gives_the_url_and_is_named(db_url, tmp_path, source):
    args, env = given(source, db_url, tmp_path)
    assert migrate_source(args, env) == source


@pytest.mark.parametrize("winner", SOURCES)
def test_a_source_wins_over_every_later_one_which_is_not_even_read(db_url, tmp_path, winner):
    args, env = given(winner, db_url, tmp_path)
    for later in SOURCES[SOURCES.index(winner) + 1 :]:
        if later.startswith("--") and args:
            continue  # the two flags together are bad usage
        # A later file source names no file: reading it would be exit 2.
        bad = str(tmp_path / "missing") if later.lower().endswith("file") else UNREACHABLE
        more_args, more_env = ([later, bad], {}) if later.startswith("--") else ([], {later: bad})
        args, env = args + more_args, {**env, **more_env}
    assert migrate_source(args, env) == winner


def test_both_flags_at_once_are_bad_usage(db_url, tmp_path):
    result = run_cli(
        "list", "--database-url", db_url, "--database-url-file", url_file(tmp_path, db_url)
    )
    assert result.exit_code == 2
    assert "--database-url or --database-url-file, not both" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("ending", ["", "\n", "\r\n"])
def test_the_file_holds_the_url_on_one_line_with_or_without_its_newline(db_url, tmp_path, ending):
    path = tmp_path / "database-url"
    path.write_bytes((db_url + ending).encode())
    assert run_cli("list", "--database-url-file", str(path)).exit_code == 0


BAD_FILES = {
    "missing": None,
    "a directory": "dir",
    "empty": b"",
    "a newline alone": b"\n",
    "two lines": b"postgresql://app:Hq7-secret@db/app\npostgresql://other/db\n",
    "two newlines": b"postgresql://app:Hq7-secret@db/app\n\n",
    "a NUL": b"postgresql://app:Hq7-secret@db/app\x00",
    "larger than 4 KB": b"postgresql://app:Hq7-secret@db/app?x=" + b"y" * 4100,
    "not UTF-8": b"postgresql://app:Hq7-secret\xff@db/app",
}


@pytest.mark.parametrize("how", ["--database-url-file", "JOBRUNNER_DATABASE_URL_FILE"])
@pytest.mark.parametrize("what", list(BAD_FILES))
def test_a_bad_url_file_is_one_line_and_exit_2_quoting_nothing_of_it(tmp_path, what, how):
    path = tmp_path / "database-url"
    content = BAD_FILES[what]
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    if how.startswith("--"):
        result = run_cli("list", how, str(path))
    else:
        result = run_cli("list", env={how: str(path)})
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and how in lines[0] and str(path) in lines[0]
    assert "Hq7" not in result.stderr and "yyyy" not in result.stderr


def test_a_file_everyone_may_read_is_used_as_a_mounted_secret_is(db_url, tmp_path):
    result = run_cli("list", "--database-url-file", url_file(tmp_path, db_url, mode=0o444))
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""


def test_a_file_others_may_write_is_used_with_a_warning(db_url, tmp_path):
    result = run_cli("list", "--database-url-file", url_file(tmp_path, db_url, mode=0o666))
    assert result.exit_code == 0, result.stderr
    (warning,) = [json.loads(line) for line in result.stderr.splitlines()]
    assert "writable by others" in warning["event"] and warning["mode"] == "0666"


def test_the_password_in_a_url_file_is_never_shown(tmp_path):
    password = "Vq8-file-password-Kz"
    path = url_file(tmp_path, f"postgresql://app:{password}@127.0.0.1:1/app")
    for args, env in [
        (["--database-url-file", path], {}),
        ([], {"JOBRUNNER_DATABASE_URL_FILE": path}),
    ]:
        result = run_cli("list", "--log-level", "debug", *args, env=env)
        assert result.exit_code == 1
        assert "cannot connect" in result.stderr
        assert "file-password" not in result.stdout + result.stderr


def test_a_tick_given_its_url_in_a_file_shows_no_password_in_ps(db_url, conn, tmp_path):
    password = "Wz4-in-the-file-only-Jq"
    path = url_file(tmp_path, conninfo.make_conninfo(db_url, password=password))
    run_cli("enqueue", "test.sleep", "--payload", '{"seconds": 3}', "--database-url", db_url)
    tick = jobrunner_process(
        "tick",
        "--database-url-file",
        path,
        "--handlers",
        "tests.handlers.basic",
        "--types",
        "test.sleep",
    )
    try:
        wait_for(
            lambda: conn.execute("SELECT status = 'running' FROM job_runs").fetchone()[0],
            "the tick to start the run",
        )
        seen_by_ps = subprocess.run(
            ["ps", "-ww", "-o", "args=", "-p", str(tick.pid)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        cmdline = Path(f"/proc/{tick.pid}/cmdline").read_bytes().decode()
    finally:
        out, err = tick.communicate(timeout=60)
    assert tick.returncode == 0, err
    assert path in seen_by_ps
    assert "in-the-file" not in seen_by_ps + cmdline
    assert "in-the-file" not in out + err
