"""Handler modules declared by an installed distribution, in the `jobrunner.handlers` group."""

from __future__ import annotations

from pathlib import Path

from cronjob.api import enqueue
from tests.conftest import jobrunner_process


def _install(site: Path, entry_points: str) -> None:
    """A distribution on `site`, as pip would leave it: a package and its dist-info."""
    package = site / "acme_jobs"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "from cronjob import handler\n\n\n"
        "@handler('acme.ping')\n"
        "def ping(ctx, payload):\n"
        "    ctx.db.execute('INSERT INTO acme_pings (run_id) VALUES (%s)', [ctx.run_id])\n"
    )
    info = site / "acme_jobs-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-jobs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


def _tick(db_url: str, site: Path, *args: str) -> tuple[int, str, str]:
    process = jobrunner_process(
        "tick", "--database-url", db_url, *args, env={"PYTHONPATH": str(site)}
    )
    stdout, stderr = process.communicate(timeout=60)
    return process.returncode, stdout, stderr


def test_a_distributions_handlers_run_without_being_named(db_url, conn, tmp_path):
    conn.execute("CREATE TABLE acme_pings (run_id bigint)")
    try:
        _install(
            tmp_path,
            "[console_scripts]\nacme = acme_jobs:main\n\n[jobrunner.handlers]\nacme = acme_jobs\n",
        )
        run_id = enqueue(conn, "acme.ping", {})
        code, _, stderr = _tick(db_url, tmp_path)
        assert code == 0, stderr
        assert conn.execute("SELECT run_id FROM acme_pings").fetchall() == [(run_id,)]
        status = conn.execute("SELECT status FROM job_runs WHERE id = %s", [run_id]).fetchone()
        assert status == ("succeeded",)
    finally:
        conn.execute("DROP TABLE acme_pings")


def test_a_distribution_whose_handlers_cannot_be_imported_stops_even_an_idle_tick(
    db_url, conn, tmp_path
):
    _install(tmp_path, "[jobrunner.handlers]\nacme = acme_jobs.missing\n")
    code, stdout, stderr = _tick(db_url, tmp_path)
    assert code == 2
    assert stdout == ""
    assert stderr.startswith(
        "jobrunner: error: cannot import handler module 'acme_jobs.missing' (entry point 'acme'):"
    )


def test_entry_points_of_other_groups_are_not_loaded(db_url, conn, tmp_path):
    _install(tmp_path, "[console_scripts]\nacme = acme_jobs.missing:main\n")
    code, _, stderr = _tick(db_url, tmp_path, "--types", "acme.ping")
    assert code == 2
    assert "no handler registered for job type(s): acme.ping" in stderr


def test_operator_commands_work_when_a_distributions_handlers_cannot_be_imported(
    db_url, conn, tmp_path
):
    # Only tick and demo load the entry-point group: repairing what a broken deploy left
    # behind must not depend on the code that broke.
    _install(tmp_path, "[jobrunner.handlers]\nacme = acme_jobs.missing\n")
    enqueue(conn, "acme.ping", {})
    for command in (
        ["list"],
        ["show", "1"],
        ["status"],
        ["metrics"],
        ["check", "--max-dead", "0"],
        ["enqueue", "acme.ping"],
        ["retry", "--type", "acme.ping", "--dry-run"],
        ["cancel", "1"],
        ["prune", "--older-than", "1d"],
        ["pause", "acme.ping"],
        ["resume", "acme.ping"],
        ["audit"],
        ["schedule", "list"],
        ["schedule", "add", "nightly", "--cron", "@daily", "--type", "acme.ping"],
    ):
        process = jobrunner_process(
            *command, "--database-url", db_url, env={"PYTHONPATH": str(tmp_path)}
        )
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, (command, stderr)
        assert "acme_jobs" not in stderr
