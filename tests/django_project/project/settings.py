"""A small Django project for jobrunner's Django tests: its database from the environment."""

import os

from psycopg.conninfo import conninfo_to_dict

_database = conninfo_to_dict(os.environ["JOBRUNNER_DJANGO_TEST_DB"])

SECRET_KEY = "only-for-tests"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django.contrib.contenttypes", "cronjob.django", "shop"]
ROOT_URLCONF = "project.urls"
ALLOWED_HOSTS = ["127.0.0.1"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _database.get("dbname", ""),
        "USER": _database.get("user", ""),
        "PASSWORD": _database.get("password", ""),
        "HOST": _database.get("host", ""),
        "PORT": _database.get("port", ""),
        # Persistent connections, as production sets them: a broken one must not outlive
        # its run. Pooled instead when JOBRUNNER_DJANGO_TEST_POOL is set (size 2).
        "CONN_MAX_AGE": 0 if os.environ.get("JOBRUNNER_DJANGO_TEST_POOL") else None,
        "OPTIONS": {
            # A psycopg option libpq does not know: left out of jobrunner's own URL.
            "prepare_threshold": 5,
            **(
                {"pool": {"min_size": 1, "max_size": 2, "timeout": 5}}
                if os.environ.get("JOBRUNNER_DJANGO_TEST_POOL")
                else {}
            ),
        },
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
