"""The command line: options and environment → settings → one library call → render → exit code.

Subcommands live in cronjob.commands and are imported only when invoked, so an
idle `jobrunner tick` pays for nothing it does not use.
"""

from __future__ import annotations

import atexit
import functools
import gc
import importlib
import sys
from collections.abc import Callable
from typing import Any

import click

from cronjob.db import database_errors
from cronjob.errors import Interrupted, JobrunnerError
from cronjob.text import one_line, printable, redact

COMMANDS = {
    "migrate": "cronjob.commands.migrate:migrate",
    "tick": "cronjob.commands.tick:tick",
    "enqueue": "cronjob.commands.runs:enqueue",
    "retry": "cronjob.commands.runs:retry",
    "cancel": "cronjob.commands.runs:cancel",
    "list": "cronjob.commands.runs:list_runs",
    "show": "cronjob.commands.runs:show",
    "demo": "cronjob.commands.demo:demo",
    "status": "cronjob.commands.ops:status",
    "metrics": "cronjob.commands.ops:metrics",
    "check": "cronjob.commands.ops:check",
    "prune": "cronjob.commands.prune:prune",
    "schedule": "cronjob.commands.schedule:schedule",
    "pause": "cronjob.commands.incident:pause",
    "resume": "cronjob.commands.incident:resume",
    "audit": "cronjob.commands.incident:audit",
    "limit": "cronjob.commands.limits:limit",
    "limits": "cronjob.commands.limits:list_limits",
    "batches": "cronjob.commands.batches:batches",
    "batch": "cronjob.commands.batches:batch",
    "sync": "cronjob.commands.django:sync",
    "web": "cronjob.commands.web:web",
    "server": "cronjob.commands.server:server",
    "wait": "cronjob.commands.wait:wait",
}
# Commands only a Django project can use: its help alone lists them (beside `schedule sync`,
# `sync` would read as a second way to apply a file); anyone may still call them and be told
# what they need.
DJANGO_COMMANDS = frozenset({"sync"})


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        from cronjob.location import django_project

        django = django_project()
        return sorted(name for name in COMMANDS if django or name not in DJANGO_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        command = getattr(importlib.import_module(module), attr)
        _give_log_level_option(command)
        return command


def _set_log_level(_ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        from cronjob import log

        log.set_level(value)


def _log_level_option() -> click.Option:
    from cronjob.log import LEVELS

    return click.Option(
        ["--log-level"],
        type=click.Choice(LEVELS, case_sensitive=False),
        envvar="JOBRUNNER_LOG_LEVEL",
        expose_value=False,
        is_eager=True,
        callback=_set_log_level,
        metavar="LEVEL",
        help="Least severe log lines written to stderr: debug, info (default), warning, "
        "error [env: JOBRUNNER_LOG_LEVEL]. At warning a tick logs failed runs, not succeeded "
        "ones.",
    )


def _give_log_level_option(command: click.Command) -> None:
    """Every command, and each command of a group, respects --log-level: one definition."""
    if not any(p.name == "log_level" for p in command.params):
        command.params.append(_log_level_option())
    for sub in getattr(command, "commands", {}).values():
        _give_log_level_option(sub)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pg-jobrunner", prog_name="jobrunner")
def cli() -> None:
    """Background jobs on the PostgreSQL you already run, woken by cron.

    Cron runs `jobrunner tick` every minute on each host; the database decides
    what is due and hands each run to exactly one tick.
    """


def database_url_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """--database-url and --database-url-file, for every command that reaches the
    database: the command is given the URL either names as `database_url`."""

    @functools.wraps(func)
    def with_database_url(*args: Any, database_url_file: str | None, **kwargs: Any) -> Any:
        if database_url_file is not None:
            if kwargs.get("database_url") is not None:
                raise click.UsageError(
                    "give --database-url or --database-url-file, not both",
                    click.get_current_context(silent=True),
                )
            from cronjob.location import GivenUrl, read_url_file

            url = read_url_file(database_url_file, source="--database-url-file")
            kwargs["database_url"] = GivenUrl(url, "--database-url-file")
        return func(*args, **kwargs)

    with_file = click.option(
        "--database-url-file",
        metavar="PATH",
        help="Read the PostgreSQL URL from this file (a Docker or Kubernetes secret): its "
        "one line, at most 4 KB. Keeps the password out of the command line and the "
        "environment. JOBRUNNER_DATABASE_URL_FILE names such a file too (see --database-url "
        "for which source wins).",
    )(with_database_url)
    return click.option(
        "--database-url",
        metavar="URL",
        help="PostgreSQL URL. Where the URL comes from, the first of: this option or "
        "--database-url-file (not both), JOBRUNNER_DATABASE_URL, the file "
        "JOBRUNNER_DATABASE_URL_FILE names, a Django project's database "
        "(DJANGO_SETTINGS_MODULE set), DATABASE_URL, else the embedded server in the "
        "user's data directory. Keep the password out of this option: every user of the "
        "host can read a command line (ps). Use --database-url-file, the environment, or "
        "~/.pgpass.",
    )(with_file)


def handlers_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """--handlers and --handlers-path, for the commands that run handlers (tick, demo) and
    no other: the rest must keep working when a handler module is broken, to repair what it
    left behind."""

    @functools.wraps(func)
    def with_handler_path(*args: Any, handlers_path: str | None, **kwargs: Any) -> Any:
        from cronjob.handlers import use_handler_path

        use_handler_path(handlers_path)
        return func(*args, **kwargs)

    with_path = click.option(
        "--handlers-path",
        envvar="JOBRUNNER_HANDLERS_PATH",
        metavar="DIR",
        help="Import handler modules from DIR too (several: separated by ':') "
        "[env: JOBRUNNER_HANDLERS_PATH]. The current directory is never imported on its "
        "own (a file planted there must not run): name it here, or install your app.",
    )(with_handler_path)
    return click.option(
        "--handlers",
        envvar="JOBRUNNER_HANDLERS",
        metavar="MODULES",
        help="Comma-separated handler modules to import [env: JOBRUNNER_HANDLERS]. "
        "Modules of the `jobrunner.handlers` entry-point group load too.",
    )(with_path)


def tenants_sql_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """--tenants-sql, for the commands that materialize a tenant-scoped schedule."""
    return click.option(
        "--tenants-sql",
        envvar="JOBRUNNER_TENANTS_SQL",
        metavar="SQL",
        help="Query whose first column lists tenant ids, for tenant-scoped "
        "schedules [env: JOBRUNNER_TENANTS_SQL].",
    )(func)


def lock_wait_option(holder: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--lock-wait, for the commands that queue behind `holder` (another host's migration)."""

    def seconds(ctx: click.Context, param: click.Parameter, value: str) -> float:
        from cronjob.errors import BadInput
        from cronjob.inputs import parse_duration

        try:
            return parse_duration(value, what="--lock-wait")
        except BadInput as exc:
            raise click.BadParameter(str(exc)) from None

    return click.option(
        "--lock-wait",
        metavar="DURATION",
        default="10m",
        show_default=True,
        callback=seconds,
        help=f"How long to wait for {holder} to finish (the wait is logged); then exit 1.",
    )


class Count(click.ParamType):
    """An integer option from `low` to `high`, in plain ASCII digits (click's own int type
    also reads `1_0` and digits of other scripts)."""

    name = "integer"

    def __init__(self, low: int, high: int = 2**31 - 1) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from cronjob.errors import BadInput
        from cronjob.inputs import excerpt, parse_integer

        try:
            return parse_integer(value, what="value", low=self.low, high=self.high)
        except BadInput:
            self.fail(
                f"{excerpt(value)}: expected an integer from {self.low} to {self.high}, "
                "in ASCII digits",
                param,
                ctx,
            )


def json_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Machine output on stdout.")(func)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: library errors become one line on stderr and an exit code."""
    _skip_collection_at_exit()
    from cronjob.log import capture_library_logs, write_unhandled_records

    capture_library_logs()
    write_unhandled_records()
    try:
        with database_errors():
            code = cli.main(args=argv, prog_name="jobrunner", standalone_mode=False)
    except click.Abort:
        click.echo("jobrunner: aborted", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        # One line, like every other bad-input error; --help has the long story.
        command = exc.ctx.command_path if exc.ctx else "jobrunner"
        click.echo(f"{command}: error: {_one_line(exc)} (see `{command} --help`)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"jobrunner: error: {_one_line(exc)}", err=True)
        sys.exit(exc.exit_code)
    except Interrupted as exc:
        # Asked for, so not an error: what was done, and what was not.
        click.echo(f"jobrunner: {_one_line(exc)}", err=True)
        sys.exit(exc.exit_code)
    except JobrunnerError as exc:
        click.echo(f"jobrunner: error: {_one_line(exc)}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


_exit_collection_skipped = False


def _skip_collection_at_exit() -> None:
    """Freeze the heap as the last exit handler, so that the interpreter's exit leaves it be.

    On the way out, the interpreter runs the cyclic garbage collector over every object
    it still tracks, though the process is about to give all of it back: over a tenth
    of the time of a tick with nothing to do, paid every minute on every host. What is
    skipped: finalizers of objects held only by reference cycles at exit, which Python
    does not promise to run. Exit handlers, and the flushing and closing of everything
    else, happen as before.
    """
    global _exit_collection_skipped
    if not _exit_collection_skipped:
        # Exit handlers run last-registered first: this one, registered before any
        # handler module is imported, runs after theirs.
        atexit.register(gc.freeze)
        _exit_collection_skipped = True


# A word longer than this in an error message is a value echoed whole (click's own usage
# errors repeat an argument as given): it is left out, not cut, so that no part of a password
# it might hold is shown, and the line stays short whatever was typed.
_LONGEST_WORD_SHOWN = 300


def _one_line(exc: BaseException) -> str:
    message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
    return printable(redact(one_line(message, longest_word=_LONGEST_WORD_SHOWN)))
