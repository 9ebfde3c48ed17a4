from django.apps import AppConfig


class JobrunnerConfig(AppConfig):
    """Installed for `manage.py jobrunner ...`; it has no models of its own."""

    name = "cronjob.django"
    label = "jobrunner"
    verbose_name = "jobrunner"
