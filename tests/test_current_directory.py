"""What is imported from the directory a command happens to be started in.

The `jobrunner` script, and `python -P -m cronjob`, import nothing from there.
`python -m cronjob` looks for handler modules and entry points elsewhere too, but Python
itself puts that directory first on the module path before any of jobrunner's code runs:
a module there named as one of the standard library's is imported in its place.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "jobrunner"


def _plant(directory: Path) -> None:
    """A handler module and an entry point declaring one, as a stranger could leave them."""
    marker = directory / "imported"
    (directory / "planted_handlers.py").write_text(
        f"open({str(marker)!r}, 'a').write('imported\\n')\n"
    )
    info = directory / "planted-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: planted\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[jobrunner.handlers]\nplanted = planted_handlers\n")


@pytest.mark.parametrize("command", [[sys.executable, "-m", "cronjob"], [str(SCRIPT)]])
def test_nothing_is_imported_from_the_current_directory(db_url, tmp_path, command):
    if not Path(command[0]).exists():
        pytest.skip("the jobrunner script is not installed")
    _plant(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [*command, "tick", "--database-url", db_url],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "imported").exists()

    named = subprocess.run(
        [*command, "tick", "--database-url", db_url, "--handlers", "planted_handlers"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert named.returncode == 2
    assert "planted_handlers" in named.stderr
    assert not (tmp_path / "imported").exists()


# Modules Python or jobrunner imports on the way to running a command, and that a
# stranger's `typing.py` or `enum.py` could stand in for.
STANDARD_NAMES = ("typing", "enum", "contextlib", "warnings", "__future__", "dataclasses")


def _plant_standard_names(directory: Path) -> Path:
    marker = directory / "imported"
    for name in STANDARD_NAMES:
        (directory / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")
    return marker


def _environment(**extra: str) -> dict[str, str]:
    unsafe = ("PYTHONPATH", "PYTHONSAFEPATH")
    return {**{k: v for k, v in os.environ.items() if k not in unsafe}, **extra}


@pytest.mark.parametrize(
    ("command", "env"),
    [
        ([str(SCRIPT)], {}),
        ([sys.executable, "-P", "-m", "cronjob"], {}),
        ([sys.executable, "-m", "cronjob"], {"PYTHONSAFEPATH": "1"}),
    ],
    ids=["jobrunner", "python -P -m cronjob", "PYTHONSAFEPATH=1 python -m cronjob"],
)
def test_a_module_named_as_a_standard_one_in_the_current_directory_is_not_imported(
    db_url, tmp_path, command, env
):
    if not Path(command[0]).exists():
        pytest.skip("the jobrunner script is not installed")
    marker = _plant_standard_names(tmp_path)
    result = subprocess.run(
        [*command, "tick", "--database-url", db_url],
        cwd=tmp_path,
        env=_environment(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert not marker.exists()


def test_plain_python_m_cronjob_imports_from_the_current_directory_before_jobrunner_runs(
    tmp_path,
):
    marker = _plant_standard_names(tmp_path)
    subprocess.run(
        [sys.executable, "-m", "cronjob", "--version"],
        cwd=tmp_path,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert marker.exists()


def _app_in(directory: Path) -> None:
    """An app's own package, as a new user has it: in the directory they work in."""
    package = directory / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text(
        "from cronjob import handler\n\n"
        "@handler('myapp.hello')\n"
        "def hello(ctx, payload):\n"
        "    ctx.db.execute('CREATE TABLE IF NOT EXISTS myapp_greeted (id bigint)')\n"
        "    ctx.db.execute('INSERT INTO myapp_greeted VALUES (%s)', [ctx.run_id])\n"
    )


def _tick_from(directory: Path, *args: str, env: dict[str, str] | None = None):
    from tests.conftest import ROOT

    clean = {k: v for k, v in os.environ.items() if not k.startswith("JOBRUNNER_")}
    return subprocess.run(
        # -P: the directory is not imported, as the `jobrunner` script does not import it;
        # PYTHONPATH names this checkout's jobrunner, not the app's directory.
        [sys.executable, "-P", "-m", "cronjob", "tick", *args],
        cwd=directory,
        env={**clean, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_apps_module_in_the_current_directory_is_one_line_saying_why_and_what_to_do(
    db_url, conn, tmp_path
):
    from tests.conftest import count

    _app_in(tmp_path)
    conn.execute("INSERT INTO job_runs (job_type, payload) VALUES ('myapp.hello', '{}')")
    result = _tick_from(tmp_path, "--database-url", db_url, "--handlers", "myapp.jobs")
    assert (result.returncode, result.stderr) == (
        2,
        "jobrunner: error: cannot import handler module 'myapp.jobs': ModuleNotFoundError: "
        "No module named 'myapp'; the current directory is not imported, on purpose: install "
        "your app (pip install -e .), or name its directory with --handlers-path DIR or "
        "JOBRUNNER_HANDLERS_PATH\n",
    )
    assert count(conn, "SELECT count(*) FROM job_runs WHERE status = 'queued' AND attempts = 0")
    assert count(conn, "SELECT count(*) FROM pg_tables WHERE tablename = 'myapp_greeted'") == 0


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_handlers_path_imports_the_apps_handlers_from_the_directory_named(
    db_url, conn, tmp_path, how
):
    from tests.conftest import count

    _app_in(tmp_path)
    conn.execute("INSERT INTO job_runs (job_type, payload) VALUES ('myapp.hello', '{}')")
    args = ["--database-url", db_url, "--handlers", "myapp.jobs"]
    if how == "flag":
        result = _tick_from(tmp_path, *args, "--handlers-path", ".")
    else:
        result = _tick_from(Path("/"), *args, env={"JOBRUNNER_HANDLERS_PATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert count(conn, "SELECT count(*) FROM myapp_greeted") == 1


def test_a_handlers_path_that_is_no_directory_is_one_line(db_url, conn, tmp_path):
    from tests.conftest import count

    result = _tick_from(
        tmp_path, "--database-url", db_url, "--handlers", "x", "--handlers-path", "missing"
    )
    assert (result.returncode, result.stderr) == (
        2,
        "jobrunner: error: --handlers-path 'missing': no such directory\n",
    )
    assert count(conn, "SELECT count(*) FROM job_runs") == 0


def test_handlers_path_still_imports_nothing_the_current_directory_holds(db_url, tmp_path):
    _plant(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = _tick_from(tmp_path, "--database-url", db_url, "--handlers-path", str(elsewhere))
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "imported").exists()
