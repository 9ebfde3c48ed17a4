"""Which Django tasks jobrunner knows, and how a run's job type finds its task.

Tasks live in `<app>/tasks.py` of an installed app (Django's convention, found the way
`django.utils.module_loading.autodiscover_modules("tasks")` finds modules), or are named
in the backend's SCHEDULES setting. Those are the project's own code and settings, and
are imported. A run's or a schedule's job type is a row's text, which anyone who may
enqueue can write: it is only ever looked up among the tasks they define, never imported,
so no row can make a tick or a web request run a module of its choosing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

# A module may end its import with sys.exit() (a script, `unittest.__main__`): that must
# not end the tick or the request that looked for tasks.
IMPORT_ERRORS = (Exception, SystemExit)

# A tasks module that did not import, and why.
Problem = tuple[str, str]

# Why a job type that is none of the known tasks' paths is not run.
UNKNOWN = (
    "it is no task of an installed app's tasks module (<app>/tasks.py) nor of the"
    " backend's SCHEDULES"
)


@dataclass(frozen=True)
class KnownTasks:
    """The tasks the project defines, by each import path they are found at, and the tasks
    modules that did not import (module: why)."""

    tasks: dict[str, Any] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)


def known_tasks() -> KnownTasks:
    """Every task of the installed apps' tasks modules and of the settings' schedules.

    A task is found under the path it is bound to in its module, and under its own
    `module_path` (where enqueue says it is), so one a tasks module imports from
    elsewhere is found by either.
    """
    from django.apps import apps
    from django.conf import settings
    from django.tasks import Task

    # The settings' apps too: a TransactionTestCase's `available_apps` hides installed
    # apps from the registry for a test's speed; their tasks are no less the project's.
    found = [app.name for app in apps.get_app_configs()]
    found += _installed_app_names(tuple(settings.INSTALLED_APPS))
    modules, problems = _tasks_modules(tuple(dict.fromkeys(found)))
    bound = {
        f"{module.__name__}.{name}": value
        for module in modules
        for name, value in list(vars(module).items())
        if isinstance(value, Task)
    }
    bound.update(_settings_tasks(tuple(settings_task_paths())))
    tasks = dict(bound)
    for task in bound.values():
        tasks.setdefault(task.module_path, task)
    return KnownTasks(tasks=tasks, problems=dict(problems))


@functools.lru_cache(maxsize=8)
def _installed_app_names(entries: tuple[str, ...]) -> tuple[str, ...]:
    """The names of the apps INSTALLED_APPS lists (a module, or an AppConfig's path), as
    Django reads them; an entry that does not load is left to Django to report."""
    from django.apps import AppConfig

    names = []
    for entry in entries:
        try:
            names.append(AppConfig.create(entry).name)
        except IMPORT_ERRORS:
            continue
    return tuple(names)


@functools.lru_cache(maxsize=8)
def _tasks_modules(app_names: tuple[str, ...]) -> tuple[tuple[Any, ...], tuple[Problem, ...]]:
    """The apps' tasks modules that import, and why the others did not: imported once a
    process, as Django's own autodiscovery does, so one that fails is not run again on
    every lookup."""
    from importlib import import_module

    from django.utils.module_loading import module_has_submodule

    modules, problems = [], []
    for app_name in app_names:
        name = f"{app_name}.tasks"
        try:
            if not module_has_submodule(import_module(app_name), "tasks"):
                continue
            modules.append(import_module(name))
        except IMPORT_ERRORS as exc:
            problems.append((name, _why(exc)))
    return tuple(modules), tuple(problems)


def settings_task_paths() -> list[str]:
    """The task paths the settings' schedules name, unchecked: a tick runs the tasks that
    import, and one bad entry must not stop it (`sync` refuses the entry)."""
    from django.tasks import Task

    from cronjob.django.connection import backend_options

    schedules = backend_options().get("SCHEDULES") or {}
    entries = schedules.values() if isinstance(schedules, dict) else []
    tasks = [entry.get("task") for entry in entries if isinstance(entry, dict)]
    return [t.module_path if isinstance(t, Task) else t for t in tasks if isinstance(t, str | Task)]


@functools.lru_cache(maxsize=8)
def _settings_tasks(paths: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    """The tasks the settings' schedules name that import (`sync` refuses the others)."""
    from django.tasks import Task
    from django.utils.module_loading import import_string

    found = []
    for path in paths:
        try:
            task = import_string(path)
        except IMPORT_ERRORS:
            continue
        if isinstance(task, Task):
            found.append((path, task))
    return tuple(found)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"
