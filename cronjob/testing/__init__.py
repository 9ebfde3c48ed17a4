"""Testing your jobs: jobrunner's pytest plugin and what its `jobrunner` fixture is.

Installing pg-jobrunner registers the plugin (entry point `pytest11`,
cronjob.testing.plugin). A test that asks for the `jobrunner` fixture gets a `Jobrunner` on
a real database, in a transaction of the test's own that is rolled back at its end:

    def test_signup_sends_a_welcome_email(jobrunner):
        signup(jobrunner.conn, "ada@example.com")      # the app enqueues on the test's connection
        jobrunner.assert_enqueued("send_email", payload={"to": "ada@example.com"})
        assert jobrunner.drain().succeeded == 1         # the tick's own code, in this process

The parts, one role each:

| module        | its one job                                                               |
|---------------|---------------------------------------------------------------------------|
| `plugin`      | the fixtures, and nothing before a test asks for one                      |
| `database`    | the session's database: found, migrated once, one connection shared       |
| `jobrunner`   | `Jobrunner`: the clock, what is enqueued, drain, materialize, run_handler |
| `enqueued`    | matching waiting runs, and the message of an assertion that fails         |
| `drain`       | `TestDrain`: the tick's claim, handler call and finalize, in the test     |
| `handle`      | one call of one handler, with nothing left enqueued                       |
| `transaction` | the `Database` of a test's attempts: `ctx.db` a savepoint in the test's   |
|               | transaction (the connection wrappers are `cronjob.store.savepoints`)      |
| `django`      | the same on Django's connection, for TestCase and pytest-django           |

The clock: a test's transaction pins the clock every jobrunner statement reads (the setting
`jobrunner.now`, queries._PINNED_CLOCK) to its start; `advance()` moves it, so what is due,
backoff, rate windows and schedules can be tested without sleeping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cronjob.testing.database import TestDatabase
    from cronjob.testing.drain import Attempted, Drained
    from cronjob.testing.handle import Handled
    from cronjob.testing.jobrunner import Jobrunner

__all__ = ["Attempted", "Drained", "Handled", "Jobrunner", "TestDatabase"]

_WHERE = {
    "Attempted": "drain",
    "Drained": "drain",
    "Handled": "handle",
    "Jobrunner": "jobrunner",
    "TestDatabase": "database",
}


def __getattr__(name: str) -> Any:
    # The plugin imports this package at pytest's start: what it names is loaded only when used.
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"cronjob.testing.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'cronjob.testing' has no attribute {name!r}")
