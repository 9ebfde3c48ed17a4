"""`manage.py jobrunner ...`: every jobrunner command, with Django set up."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Run a jobrunner command (tick, sync, status, list, show, retry, ...) with this "
        "project's settings: `manage.py jobrunner --help` lists them."
    )

    def run_from_argv(self, argv: list[str]) -> None:
        # jobrunner parses its own arguments, --help included; manage.py's own --settings
        # and --pythonpath have done their work by now.
        from cronjob.cli import main

        main(_without_manage_py_options(argv[2:]))

    def print_help(self, prog_name: str, subcommand: str) -> None:
        from cronjob.cli import main

        with contextlib.suppress(SystemExit):  # main() always exits
            main(["--help"])

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def handle(self, *args: Any, **options: Any) -> None:
        """call_command("jobrunner", "tick", ...): CommandError if jobrunner exits non-zero."""
        from django.core.management.base import CommandError

        from cronjob.cli import main

        try:
            main([str(arg) for arg in args])
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise CommandError(f"jobrunner exited {exc.code}", returncode=exc.code) from None


def _without_manage_py_options(args: list[str]) -> list[str]:
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--settings", "--pythonpath"):
            skip = True
        elif not arg.startswith(("--settings=", "--pythonpath=")):
            kept.append(arg)
    return kept
