"""A small Django project for jobrunner's Django tests: its database from the environment."""

import os

from psycopg.conninfo import conninfo_to_dict

_database = conninfo_to_dict(os.environ["JOBRUNNER_DJANGO_TEST_DB"])

SECRET_KEY = "only-for-tests"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django.contrib.contenttypes", "cronjob.django", "shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _database.get("dbname", ""),
        "USER": _database.get("user", ""),
        "PASSWORD": _database.get("password", ""),
        "HOST": _database.get("host", ""),
        "PORT": _database.get("port", ""),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TASKS = {
    "default": {
        "BACKEND": "cronjob.django.JobrunnerBackend",
        "QUEUES": ["default", "reports"],
        "OPTIONS": {
            "SCHEDULES": {
                "new-year-tally": {
                    "task": "shop.tasks.tally",
                    "cron": "0 0 1 1 *",
                    "kwargs": {"label": "new year"},
                    "catch_up": "all",
                },
            },
        },
    }
}
