"""Commands for Django projects (DJANGO_SETTINGS_MODULE set, or `manage.py jobrunner`)."""

from __future__ import annotations

import click

from cronjob.cli import database_url_option, lock_wait_option
from cronjob.commands.incident import actor_option, reason_option


@click.command()
@database_url_option
@click.option("--prune", is_flag=True, help="Remove schedules that are not in the settings.")
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@lock_wait_option("another host's schedule sync")
@actor_option
@reason_option
def sync(
    database_url: str | None,
    prune: bool,
    dry_run: bool,
    lock_wait: float,
    actor: str | None,
    reason: str | None,
) -> None:
    """Make the schedules match the periodic tasks in Django's settings.

    The jobrunner backend's OPTIONS "SCHEDULES" in settings.TASKS, applied as
    `jobrunner schedule sync` applies a file: upserted by name, checked whole before
    anything is written. A deploy step, next to `manage.py migrate`.
    """
    from cronjob.commands.schedule import apply_sync
    from cronjob.django.connection import django_in_use, setup
    from cronjob.errors import BadInput

    if not django_in_use():
        raise BadInput("sync reads Django's settings: set DJANGO_SETTINGS_MODULE")
    setup()
    from cronjob.django.runner import schedule_specs

    apply_sync(
        schedule_specs(), database_url, prune, dry_run, lock_wait, actor, reason,
        source="the settings",
    )  # fmt: skip
