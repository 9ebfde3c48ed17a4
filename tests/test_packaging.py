"""The wheel and the sdist, built and checked as a release would be, and the wheel alone
installed into a fresh venv, where it runs the demo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build", reason="the test extra's `build` is not installed")
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return out


def test_the_wheel_and_sdist_build_and_pass_twine_check(dist):
    pytest.importorskip("twine", reason="the test extra's `twine` is not installed")
    files = sorted(dist.iterdir())
    assert sorted(f.suffix for f in files) == [".gz", ".whl"], files
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_wheel_alone_installs_into_a_fresh_venv_and_runs_the_demo(dist, tmp_path):
    wheel = next(dist.glob("*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", f"{wheel}[embedded]"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    # Not this checkout: the wheel's own package, its own sql/ and nothing else.
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "JOBRUNNER_DATA_DIR": str(tmp_path / "d"),
    }
    demo = subprocess.run(
        [str(venv / "bin" / "jobrunner"), "demo"],
        # Not this checkout: the wheel's own package, its own sql/ and nothing else.
        cwd=tmp_path,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "JOBRUNNER_DATA_DIR": str(tmp_path / "data"),
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "demo.flaky" in demo.stdout
    shown = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import cronjob; print(cronjob.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    assert shown.startswith(str(venv)), shown
