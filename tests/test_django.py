"""The Django suite (tests/django_suite), on the oldest Django jobrunner supports and the newest.

Django 6 needs Python 3.12 or newer: each version gets a venv of its own under .venvs/,
made once with the first Python >= 3.12 found, with jobrunner installed from this checkout
by its `django` extra, and runs the suite against this session's PostgreSQL server.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

# The oldest supported release series, and the newest release.
DJANGO_VERSIONS = {"oldest": "django~=6.0.0", "newest": "django>=6.0"}
# The release whose own tests of Tasks (tests/tasks of its source distribution) run on
# jobrunner's backend, in a venv of its own, as they test against that release's code.
DJANGO_TASKS_TESTS = "6.1.3"
# For the test project's own pytest tests (tests/django_project/pytest_tests), which the suite
# runs in a pytest of their own: the suite itself runs without it (`-p no:django`).
PYTEST_DJANGO = "pytest-django>=4.9"


def _python_312_or_newer() -> str | None:
    if sys.version_info >= (3, 12):
        return sys.executable
    names = ["python3.14", "python3.13", "python3.12"]
    found = [shutil.which(name) for name in names]
    # pyenv's interpreters: its shims run only the versions pyenv has selected.
    pyenv_roots = {os.environ.get("PYENV_ROOT") or "", os.path.expanduser("~/.pyenv")}
    for root in sorted(filter(None, pyenv_roots)):
        found += sorted(glob.glob(os.path.join(root, "versions", "3.1[2-9]*", "bin", "python3")))
    for python in filter(None, found):
        probe = subprocess.run(
            [python, "-c", "import sys, venv; print(sys.version_info >= (3, 12))"],
            capture_output=True,
            text=True,
        )
        if probe.stdout.strip() == "True":
            return python
    return None


def _venv(which: str, requirement: str) -> Path:
    python = _python_312_or_newer()
    if python is None:
        pytest.skip("Django >= 6 needs Python >= 3.12, and none is installed")
    venv = ROOT / ".venvs" / f"django-{which}"
    stamp = venv / "installed.txt"
    wanted = f"{python}\n{requirement}\n{PYTEST_DJANGO}\n{(ROOT / 'pyproject.toml').read_text()}"
    if not (stamp.exists() and stamp.read_text() == wanted):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [
                str(venv / "bin" / "pip"),
                "install",
                "-q",
                "-e",
                f"{ROOT}[django,test]",
                requirement,
                PYTEST_DJANGO,
            ],
            check=True,
            capture_output=True,
        )
        stamp.write_text(wanted)
    return venv


@pytest.mark.parametrize("which", sorted(DJANGO_VERSIONS))
def test_the_django_suite_passes(which: str, server_url: str) -> None:
    venv = _venv(which, DJANGO_VERSIONS[which])
    version = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import django; print(django.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version.startswith("6.") or int(version.split(".")[0]) > 6
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBRUNNER_", "DJANGO_"))}
    env.update(JOBRUNNER_DJANGO_SUITE="1", JOBRUNNER_TEST_DATABASE_URL=server_url)
    done = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:django",
            "tests/django_suite",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    summary = done.stdout.strip().splitlines()[-1:] or ["(no output)"]
    assert done.returncode == 0, f"Django {version}: {done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    assert "passed" in summary[0] and "skipped" not in summary[0], summary[0]


def _django_tests_dir(venv: Path, version: str) -> Path:
    """tests/ of Django `version`'s source distribution: downloaded by the venv's pip (from
    its cache, else PyPI) and extracted under .venvs/ once. Nothing of it is in this
    repository."""
    top = ROOT / ".venvs" / f"django-{version}-source"
    tests = top / f"django-{version}" / "tests"
    if not (tests / "runtests.py").exists():
        shutil.rmtree(top, ignore_errors=True)
        top.mkdir(parents=True)
        pip = [str(venv / "bin" / "pip"), "download", "-q", "--no-deps", "--no-binary", ":all:"]
        subprocess.run(
            [*pip, "-d", str(top), f"django=={version}"], check=True, capture_output=True
        )
        with tarfile.open(top / f"django-{version}.tar.gz") as archive:
            inside = f"django-{version}/tests/"
            wanted = [m for m in archive.getmembers() if m.name.startswith(inside)]
            archive.extractall(top, members=wanted, filter="data")
    return tests


def test_djangos_own_tests_of_tasks_pass_on_jobrunners_backend(server_url: str) -> None:
    """Django's tests/tasks, entire, with its test app installed by its own runtests.py and
    jobrunner's backend in the places of the backends they name (tests/django_own_tasks)."""
    version = DJANGO_TASKS_TESTS
    venv = _venv(f"tasks-{version}", f"django=={version}")
    tests = _django_tests_dir(venv, version)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBRUNNER_", "DJANGO_"))}
    env.update(JOBRUNNER_DJANGO_TEST_DB=server_url)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "tests.django_own_tasks.run", str(tests)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-8000:]}"
    ran = [line for line in done.stderr.splitlines() if line.startswith("Ran ")]
    assert ran and int(ran[-1].split()[1]) >= 80, ran
    # Every test passes, but the one DIVERGENT names (tests/django_own_tasks/runner.py).
    assert re.search(r"^OK \(expected failures=1\)$", done.stderr, re.M), done.stderr[-2000:]


def test_without_django_installed_its_settings_variable_is_ignored_with_a_word(
    db_url: str,
) -> None:
    from tests.conftest import run_cli

    if importlib.util.find_spec("django") is not None:
        pytest.skip("Django is installed here; the Django suite covers this case")
    env = {"DJANGO_SETTINGS_MODULE": "project.settings", "DATABASE_URL": db_url}
    assert run_cli("status", env=env).exit_code == 0  # DATABASE_URL, as without Django
    for args, what in [
        (["sync"], "sync reads Django's settings"),
        (["tick", "--queues", "emails"], "--queues selects Django tasks"),
    ]:
        result = run_cli(*args, env=env)
        assert result.exit_code == 2
        assert f"{what}: it needs the django extra: pip install" in result.stderr
