"""Subcommands, and what they share: turning settings into a ready connection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cronjob.settings import Settings

if TYPE_CHECKING:
    from cronjob.db import Database


def open_database(
    settings: Settings, *, require_schema: bool = True, embedded_only: bool = False
) -> tuple[Database, Any]:
    """Resolve the URL, connect, and check the schema (migrating the embedded server).

    With `embedded_only`, the embedded server whatever URL is configured.
    """
    from cronjob import location, schema
    from cronjob.db import Database

    if embedded_only:
        from cronjob import embedded

        url, source = embedded.url(), "embedded"
    else:
        url, source = location.resolve_url(settings.database_url)
    database = Database(url, source)
    conn = database.connect()
    if source == "embedded":
        from cronjob import log, migrate

        applied = migrate.apply(conn)
        log.info(
            "using the embedded PostgreSQL server",
            data_dir=str(_embedded_dir()),
            **({"migrated": [m.version for m in applied]} if applied else {}),
        )
    elif require_schema:
        schema.require_schema(conn)
    return database, conn


def open_connection(database_url: str | None) -> Any:
    """A ready connection for a command that runs no handlers, and so loads none."""
    from cronjob.db import read_times_beyond_the_calendar

    _, conn = open_database(Settings.build(database_url))
    read_times_beyond_the_calendar(conn)
    return conn


def _embedded_dir() -> Any:
    from cronjob.embedded import data_dir

    return data_dir()


def load_handlers(settings: Settings) -> None:
    from cronjob.handlers import load_handler_modules

    load_handler_modules(list(settings.handler_modules))


def django_setup(needed_for: str | None = None) -> bool:
    """Set Django up if this is a Django project's command (Django installed and
    DJANGO_SETTINGS_MODULE set); False if it is not. `needed_for` says what of the command
    needs one, and makes a missing project BadInput saying so."""
    from cronjob.location import django_project

    if not django_project():
        if needed_for:
            from cronjob import extras
            from cronjob.errors import BadInput, MissingExtra

            if not extras.installed("django"):
                raise MissingExtra(
                    f"{needed_for}: it needs the django extra: {extras.pip_command('django')}"
                )
            raise BadInput(f"{needed_for}: it needs DJANGO_SETTINGS_MODULE set")
        return False
    from cronjob.django.connection import setup

    setup()
    return True
