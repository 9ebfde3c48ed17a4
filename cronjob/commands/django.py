"""Commands for Django projects (DJANGO_SETTINGS_MODULE set, or `manage.py jobrunner`)."""

from __future__ import annotations

import click

from cronjob.commands.schedule import sync_options


@click.command()
@sync_options("the settings")
def sync(
    database_url: str | None,
    prune: bool,
    dry_run: bool,
    lock_wait: float,
    actor: str | None,
    reason: str | None,
) -> None:
    """Make the schedules (and limits) match the periodic tasks in Django's settings.

    The jobrunner backend's OPTIONS "SCHEDULES" (and "LIMITS") in settings.TASKS, applied as
    `jobrunner schedule sync` applies a file: upserted by name, checked whole before
    anything is written. A deploy step, next to `manage.py migrate`.
    """
    from cronjob.commands import django_setup
    from cronjob.commands.schedule import apply_sync

    django_setup("sync reads Django's settings")
    from cronjob.django.runner import limit_specs, schedule_specs

    apply_sync(
        schedule_specs(),
        database_url,
        prune,
        dry_run,
        lock_wait,
        actor,
        reason,
        source="the settings",
        limits=limit_specs(),
    )
