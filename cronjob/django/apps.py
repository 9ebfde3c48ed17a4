from typing import Any

from django.apps import AppConfig


class JobrunnerConfig(AppConfig):
    """`manage.py jobrunner ...`, and jobrunner's tables made by `manage.py migrate`.

    It has no models of its own: after Django's migrations, `migrate` applies jobrunner's
    to the backend's database, the test database that `manage.py test` makes included.
    """

    name = "cronjob.django"
    label = "jobrunner"
    verbose_name = "jobrunner"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        post_migrate.connect(_migrate_jobrunner, sender=self)


def _migrate_jobrunner(sender: Any, using: str, plan: Any = None, **kwargs: Any) -> None:
    from cronjob.django.connection import database_alias, django_connection

    if using != database_alias():
        return
    from cronjob import migrate

    conn = django_connection(using)
    # Its own transaction on Django's connection, which migrate has left in autocommit.
    migrate.apply(conn)
