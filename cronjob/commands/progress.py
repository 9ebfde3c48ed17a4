"""Long work seen from the command line: its progress on stderr, and SIGINT or SIGTERM as a
stop between two batches. The one place both happen, for every command whose work goes a
batch at a time: `prune`, `retry` and `cancel` by filter, `enqueue --jsonl`, `schedule
sync`, `migrate`.

The bar is click's, on stderr, and only when stderr is a terminal and the command was not
asked for --json: piped, under cron or with --json, a command prints exactly what it did
before there was a bar. It appears once the work has gone on for half a second (quick work
shows none; JOBRUNNER_PROGRESS_DELAY, a duration, changes how long: `0` shows it from the
first step, whatever the speed of the machine), and is redrawn at most five times a second.

The first SIGINT or SIGTERM asks the work to stop before its next batch (cronjob.progress);
the command then says what was done, that the rest is untouched, and exits 130 or 143. That
first signal also puts back the handlers that were there before: a second one does what it
always did, and stops the command at once (the batch under way rolls back).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import click

from cronjob.errors import Interrupted
from cronjob.progress import Progress, Stopped
from cronjob.text import printable

DELAY = 0.5  # seconds of work before the bar appears, unless JOBRUNNER_PROGRESS_DELAY says
DELAY_VARIABLE = "JOBRUNNER_PROGRESS_DELAY"
REFRESH = 0.2  # seconds between two redraws, at least
BAR_WIDTH = 20


def on_terminal(as_json: bool = False) -> bool:
    """Whether progress is shown: stderr is a terminal, no --json, and the work is the
    process's own (its main thread's), not a request a server's thread serves."""
    return (
        not as_json
        and threading.current_thread() is threading.main_thread()
        and sys.stderr.isatty()
    )


class Watch(Progress):
    """The progress of one command's work, drawn on stderr when `shown`, and the stop its
    first signal asks for. `done` counts what committed. Work that watches itself from a
    thread of its own (a migration) may tell it from there: a lock keeps the bar whole."""

    def __init__(
        self,
        label: str,
        *,
        unit: str,
        total: int | None,
        shown: bool,
        timed: bool,
        delay: float = DELAY,
    ) -> None:
        self.label, self.unit, self.total = label, unit, total
        self.shown = self.watched = shown
        self.timed = timed
        self.delay = delay
        self.done = 0
        self.signum: int | None = None
        self._text = ""
        self._started = time.monotonic()
        self._drawn = -math.inf
        self._bar: Any = None
        self._lock = threading.Lock()

    def expect(self, total: int | None) -> None:
        with self._lock:
            self.total = total
            if self._bar is not None:
                self._bar.length = total
            self._draw()

    def advance(self, done: int) -> None:
        with self._lock:
            self.done += done
            self._draw()

    def note(self, text: str) -> None:
        with self._lock:
            self._text = printable(text)
            self._draw()

    def checkpoint(self) -> None:
        if self.signum is not None:
            raise Stopped

    def close(self) -> None:
        """The bar's last state, and the line ended: what follows starts on a line of its own."""
        with self._lock:
            if self._bar is not None:
                self._draw(final=True)
                self._bar.render_finish()
                self._bar = None

    def _draw(self, *, final: bool = False) -> None:
        if not self.shown:
            return
        now = time.monotonic()
        if not final and (now - self._started < self.delay or now - self._drawn < REFRESH):
            return
        self._drawn = now
        if self._bar is None:
            self._bar = self._new_bar()
        self._bar.update(self.done - self._bar.pos, self._info(now) or " ")

    def _new_bar(self) -> Any:
        # Without a total, the bar needs something it cannot tell the length of.
        endless = iter(int, 1) if self.total is None else None
        return click.progressbar(
            endless,
            length=self.total,
            label=self.label,
            # A few steps of unknown length (migrations) leave the line to what they say.
            bar_template="%(label)s  [%(bar)s]  %(info)s" if self.timed else "%(label)s  %(info)s",
            show_eta=False,
            show_percent=False,
            show_pos=False,
            item_show_func=lambda info: info,
            width=BAR_WIDTH,
            file=sys.stderr,
            update_min_steps=0,  # a new note is drawn too, with no step taken
        )

    def _info(self, now: float) -> str:
        """Done (of the total, when known), the rate and the time left, or that the work is
        stopping; then the note."""
        bar, parts = self._bar, []
        if self.total is not None:
            parts.append(f"{self.done:,}/{self.total:,} {self.unit}")
            if self.timed:
                parts.append(f"{min(100, self.done * 100 // max(1, self.total))}%")
        elif self.timed or self.done:
            parts.append(f"{self.done:,} {self.unit}")
        elapsed = now - self._started
        if self.signum is not None:
            again = " (Ctrl-C again: at once)" if self.signum == signal.SIGINT else ""
            parts.append(f"stopping after this step{again}")
        elif self.timed and elapsed > 0:
            parts.append(f"{self.done / elapsed:,.0f} {self.unit}/s")
            if self.total is not None and bar.eta_known and not bar.finished:
                parts.append(f"{bar.format_eta()} left")
        if self._text:
            parts.append(self._text)
        drawn = len(self.label) + 2 + (BAR_WIDTH + 4 if self.timed else 0)
        return _clipped("  ".join(parts), _columns() - drawn - 1)


def _delay() -> float:
    """How long work goes on before its bar appears: JOBRUNNER_PROGRESS_DELAY, else DELAY.
    Read only where a bar may be drawn: under cron the variable changes nothing."""
    text = os.environ.get(DELAY_VARIABLE, "").strip()
    if not text:
        return DELAY
    from cronjob.inputs import parse_duration

    return parse_duration(text, what=DELAY_VARIABLE)


def _columns() -> int:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except OSError:
        return 80


def _clipped(text: str, width: int) -> str:
    """The bar on one line of the terminal, so each redraw overwrites the last."""
    width = max(width, 10)
    return text if len(text) <= width else text[: width - 1] + "…"


@contextlib.contextmanager
def watching(
    label: str,
    *,
    told: Callable[[int], str],
    unit: str = "runs",
    total: int | None = None,
    shown: bool = True,
    as_json: bool = False,
    timed: bool = True,
) -> Iterator[Watch]:
    """A Watch for the block's work: a bar on stderr when the work is worth one (`shown`),
    stderr is a terminal and the command prints no --json; and SIGINT and SIGTERM handled
    while the block runs.

    Stopped by a signal, the block's work ends in Interrupted, whose message is the
    signal's name and `told(done)`: what was done, and that the rest is untouched. `unit`
    names what the work counts, `total` how many there are when known; without `timed`, no
    rate and no time left are shown (a count of migrations has neither).
    """
    shown = shown and on_terminal(as_json)
    delay = _delay() if shown else DELAY
    watch = Watch(label, unit=unit, total=total, shown=shown, timed=timed, delay=delay)
    with _signals_stop(watch):
        try:
            yield watch
        except (Stopped, KeyboardInterrupt):
            if watch.signum is None:
                raise
            watch.close()
            name = signal.Signals(watch.signum).name
            message = f"stopped by {name}: {told(watch.done)}"
            raise Interrupted(message, signum=watch.signum) from None
        finally:
            watch.close()


@contextlib.contextmanager
def _signals_stop(watch: Watch) -> Iterator[None]:
    """The first SIGINT or SIGTERM sets `watch.signum` and puts the old handlers back.

    Only the main thread may handle signals: elsewhere (a command run by a test's thread)
    they are left as they are. A signal the process ignores stays ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    # None: a handler set outside Python, which cannot be put back from here.
    handled = [sig for sig, was in previous.items() if was not in (signal.SIG_IGN, None)]

    def restore() -> None:
        for sig in handled:
            signal.signal(sig, previous[sig])

    def on_signal(signum: int, _frame: Any) -> None:
        watch.signum = signum
        restore()

    for sig in handled:
        signal.signal(sig, on_signal)
    try:
        yield
    finally:
        restore()


@contextlib.contextmanager
def tuned_for_bulk() -> Iterator[None]:
    """For a bulk enqueue, no cyclic garbage collection: its passes over the runs a chunk
    holds cost a sixth of the time, and the strings, dicts and runs it makes hold no cycles.
    And the interpreter's lock handed over every half millisecond, not every five: while the
    sender waits for it, for a moment's work, the server has nothing to store."""
    import gc

    collecting, interval = gc.isenabled(), sys.getswitchinterval()
    gc.disable()
    sys.setswitchinterval(0.0005)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        if collecting:
            gc.enable()
