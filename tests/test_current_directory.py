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
