"""Settings for Django's own test runner (tests/runtests.py) running its tests/tasks on
jobrunner: the database from the environment, jobrunner's backend the default."""

import os

from psycopg.conninfo import conninfo_to_dict

_database = conninfo_to_dict(os.environ["JOBRUNNER_DJANGO_TEST_DB"])

SECRET_KEY = "only-for-tests"
USE_TZ = True
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
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
# The backend tests/tasks/tasks.py declares its tasks with: they are jobrunner's tasks.
TASKS = {"default": {"BACKEND": "cronjob.django.JobrunnerBackend"}}
TEST_RUNNER = "tests.django_own_tasks.runner.Runner"
