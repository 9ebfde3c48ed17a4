"""How long work tells of its progress, and learns that it should stop: the library's side.

Work that goes a batch at a time (retrying, cancelling or pruning a selection, enqueueing
a JSONL file, syncing schedules, migrating) takes a `Progress` and calls it as it goes:

- `expect(total)` when it learns how much there is to do;
- `advance(done)` once a batch of `done` has committed;
- `note(text)` to say what it is doing or waiting for, where it has no count to give;
- `checkpoint()` before each batch: it raises `Stopped` there when a stop was asked
  for, so what committed stays and the rest is untouched. Raised inside a transaction,
  it rolls that transaction back like any other exception.

The default, `QUIET`, shows nothing and never stops the work. The command line's own
(cronjob.commands.progress) draws a bar on a terminal and asks for a stop on SIGINT or
SIGTERM: the library knows nothing of either.
"""

from __future__ import annotations


class Stopped(BaseException):
    """The work stopped between two batches, as asked. Not an Exception, as
    KeyboardInterrupt is not: no `except Exception` on its way out may swallow it."""


class Progress:
    """Reports nowhere and never stops: what work is given when no one is watching."""

    # Whether anyone reads `note`: work that must do more to tell what it waits for (a
    # migration watched from a connection of its own) does it only then.
    watched = False

    def expect(self, total: int | None) -> None:
        """The work now knows it has `total` to do (None: it cannot tell)."""

    def advance(self, done: int) -> None:
        """A batch of `done` has committed."""

    def note(self, text: str) -> None:
        """What the work is doing, or waiting for, now."""

    def checkpoint(self) -> None:
        """Between two batches: raises Stopped if the work should stop here."""


QUIET = Progress()
