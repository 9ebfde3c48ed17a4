"""jobrunner in a Django project: a Tasks backend, `manage.py jobrunner`, ORM transactions.

    TASKS = {"default": {"BACKEND": "cronjob.django.JobrunnerBackend"}}
    INSTALLED_APPS = [..., "cronjob.django"]   # for `manage.py jobrunner ...`

Nothing here is imported unless a Django project asks for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cronjob.django.backend import JobrunnerBackend
    from cronjob.django.runner import atomic
    from cronjob.django.tasks import JobrunnerTask, task

__all__ = ["JobrunnerBackend", "JobrunnerTask", "atomic", "task"]


def __getattr__(name: str) -> Any:
    # Django imports this package while it populates its app registry, before the
    # backend's own imports (django.tasks) may be ready to load.
    if name == "JobrunnerBackend":
        from cronjob.django.backend import JobrunnerBackend

        return JobrunnerBackend
    if name in ("JobrunnerTask", "task"):
        from cronjob.django import tasks

        return getattr(tasks, name)
    if name == "atomic":
        from cronjob.django.runner import atomic

        return atomic
    raise AttributeError(f"module 'cronjob.django' has no attribute {name!r}")
