"""`python -m cronjob` and the `jobrunner` script import the same things: nothing from
the directory the command happens to be started in."""

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
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "imported").exists()

    named = subprocess.run(
        [*command, "tick", "--database-url", db_url, "--handlers", "planted_handlers"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert named.returncode == 2
    assert "planted_handlers" in named.stderr
    assert not (tmp_path / "imported").exists()
