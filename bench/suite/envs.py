"""Peer installations under bench/.envs/: one pip venv or npm prefix per peer.

Nothing here is committed; an installation is reused while its requirement
list is unchanged (a marker file records it), and redone with --reinstall.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

_MARKER = ".jrbench-requirements"
INSTALL_TIMEOUT = 900


def _installed(prefix: Path, requirements: list[str], reinstall: bool) -> bool:
    marker = prefix / _MARKER
    if reinstall:
        shutil.rmtree(prefix, ignore_errors=True)
        return False
    return marker.exists() and marker.read_text() == "\n".join(requirements)


def pip_env(envs_dir: Path, name: str, requirements: list[str], reinstall: bool) -> Path:
    """A venv (on the harness's own interpreter) holding `requirements`."""
    venv = envs_dir / name
    if _installed(venv, requirements, reinstall):
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *requirements,
        ],
        check=True,
        timeout=INSTALL_TIMEOUT,
    )
    (venv / _MARKER).write_text("\n".join(requirements))
    return venv


def npm_prefix(envs_dir: Path, name: str, packages: list[str], reinstall: bool) -> Path:
    """An npm prefix with `packages` in its node_modules."""
    prefix = envs_dir / name
    if _installed(prefix, packages, reinstall):
        return prefix
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.mkdir(parents=True)
    (prefix / "package.json").write_text(json.dumps({"name": f"jrbench-{name}", "private": True}))
    subprocess.run(
        [
            "npm",
            "install",
            "--prefix",
            str(prefix),
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            *packages,
        ],
        check=True,
        timeout=INSTALL_TIMEOUT,
    )
    (prefix / _MARKER).write_text("\n".join(packages))
    return prefix


def pip_version(venv: Path, distribution: str) -> str:
    out = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            f"import importlib.metadata as m; print(m.version({distribution!r}))",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout.strip() or "unknown"


def npm_version(prefix: Path, package: str) -> str:
    manifest = prefix / "node_modules" / package / "package.json"
    try:
        return str(json.loads(manifest.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return "unknown"
