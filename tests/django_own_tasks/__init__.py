"""Django's own tests of Tasks (tests/tasks of its source distribution) against jobrunner's
backend: run by tests/test_django.py in the Django venv; see run.py."""
