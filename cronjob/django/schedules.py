"""Periodic tasks declared in settings, as schedule definitions.

    TASKS = {"default": {
        "BACKEND": "cronjob.django.JobrunnerBackend",
        "OPTIONS": {"SCHEDULES": {
            "nightly-report": {
                "task": "reports.tasks.nightly_report",
                "cron": "30 2 * * *",
                "timezone": "Europe/Amsterdam",
                "kwargs": {"format": "pdf"},
                "catch_up": "latest",
            },
        }},
    }}

Each entry takes the keys of a `schedule sync` file, but "task" for "type" and "args"
and "kwargs" for "payload"; "priority" is Django's (larger runs first). `manage.py
jobrunner sync` applies them with `schedule sync`'s semantics.
"""

from __future__ import annotations

from typing import Any

from cronjob.definitions import FILE_KEYS, DefinitionSpec, check_keys, definition_spec
from cronjob.errors import BadInput
from cronjob.inputs import excerpt

SETTINGS_KEYS = (
    "task",
    "args",
    "kwargs",
    *(key for key in FILE_KEYS if key not in ("type", "payload")),
)


def specs_from_settings(schedules: Any) -> list[DefinitionSpec]:
    """Check every entry; BadInput naming the first problem (nothing is written)."""
    if not isinstance(schedules, dict):
        raise BadInput('TASKS OPTIONS "SCHEDULES" must be a dict of name: schedule')
    return [_spec(name, entry) for name, entry in schedules.items()]


def _spec(name: Any, entry: Any) -> DefinitionSpec:
    where = f"settings schedule {excerpt(str(name))}"
    if not isinstance(entry, dict):
        raise BadInput(f"{where}: expected a dict of settings")
    check_keys(where, entry, SETTINGS_KEYS, ("task", "cron"))
    args, kwargs = entry.get("args", []), entry.get("kwargs", {})
    if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
        raise BadInput(f"{where}: args must be a list and kwargs a dict")
    fields = {FILE_KEYS[key]: value for key, value in entry.items() if key in FILE_KEYS}
    if "priority" in fields:
        priority = fields["priority"]
        if not isinstance(priority, int) or isinstance(priority, bool) or abs(priority) > 100:
            raise BadInput(f"{where}: priority must be a whole number from -100 to 100")
        fields["priority"] = -priority
    try:
        return definition_spec(
            name,
            job_type=_task_path(entry["task"]),
            payload={"args": list(args), "kwargs": kwargs},
            **fields,
        )
    except BadInput as exc:
        raise BadInput(f"{where}: {exc}") from None


def _task_path(task: Any) -> str:
    """The task's import path, once it imports as a task of jobrunner's backend."""
    from django.tasks import Task

    from cronjob.django.backend import importable_task

    if isinstance(task, Task):
        task = task.module_path
    if not isinstance(task, str):
        raise BadInput("task must be a task's import path")
    try:
        importable_task(task)
    except ValueError as exc:
        raise BadInput(f"task {excerpt(task)}: {exc}") from None
    return task
