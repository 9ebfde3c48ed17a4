"""Where the database is: a flag, the environment, a Django project's settings, or else
the embedded server.

Above both the connection (`cronjob.db`) and the places a URL can come from
(`cronjob.django.connection`, `cronjob.embedded`), which are imported only when asked.
"""

from __future__ import annotations

import os

from cronjob.text import remember_password

URL_ENV_VARS = ("JOBRUNNER_DATABASE_URL", "DATABASE_URL")


def resolve_url(explicit: str | None) -> tuple[str, str]:
    """The database URL and where it came from: a flag, JOBRUNNER_DATABASE_URL, a Django
    project's settings (with DJANGO_SETTINGS_MODULE set), DATABASE_URL, or the embedded
    server."""
    if explicit:
        remember_password(explicit)
        return explicit, "--database-url"
    for name in URL_ENV_VARS:
        if name == "DATABASE_URL" and django_project():
            # A Django project's own database, where enqueue writes its runs.
            from cronjob.django.connection import database_conninfo

            return database_conninfo(), "Django settings"
        value = os.environ.get(name)
        if value:
            remember_password(value)
            return value, name
    from cronjob import embedded

    return embedded.url(), "embedded"


def django_project() -> bool:
    """DJANGO_SETTINGS_MODULE names a project's settings and Django is installed (a shell may
    export the variable to a jobrunner installed on its own): the database is the project's."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return False  # imports nothing more: the idle tick's path
    import importlib.util

    return importlib.util.find_spec("django") is not None
