"""The claim's notes: what the database tells a tick about its limited types besides the runs
it hands over (migration 0023's jobrunner_claimable_limited), as notices on the tick's
connection.

| code    | what                                              | the tick                          |
|---------|---------------------------------------------------|-----------------------------------|
| `01J01` | another session holds the lock of a key of a      | warns, once a tick for each type  |
|         | limited type (and its runs wait for it)           |                                   |
| `01J02` | the choice of a limited type's runs failed: none  | warns, once a tick for each type; |
|         | of them was claimed, the other types were         | ends with exit 1 when done        |
| `01J03` | a rate holds due runs back: in how many seconds   | the drain looks again then        |
|         | the earliest of them may start                    | (`Batcher.held_back`)             |

The connection keeper hands each notice to `ClaimNotes.noticed`, on the thread that runs the
statement; the drain takes the rate's hold with the claim's result (`held_back`), on the main
thread, once the claim's thread is done with it. Only these notes log: they alone see them.
"""

from __future__ import annotations

import threading
from typing import Any

from cronjob.report import TickReport
from cronjob.text import one_line, redact

KEY_LOCKED = "01J01"
TYPE_NOT_CHOSEN = "01J02"
RATE_HOLD = "01J03"
ERROR_CHARS = 500  # of a failed choice's error, in the log and the exit message
_NOT_CHOSEN = "could not be chosen: "  # what the database's error follows in 01J02's message


class ClaimNotes:
    """What the claims of one tick noted about its limited types."""

    def __init__(self, report: TickReport, log: Any) -> None:
        self.report = report
        self.log = log
        self._lock = threading.Lock()
        self._locked: set[str] = set()  # types whose locked key was told this tick
        self._hold: float | None = None  # seconds, from the last claim that noted one

    def noticed(self, diag: Any) -> None:
        """A notice on the tick's connection (a psycopg Diagnostic); others than the claim's
        are not the tick's business."""
        code = diag.sqlstate
        if code not in (KEY_LOCKED, TYPE_NOT_CHOSEN, RATE_HOLD):
            return
        detail = diag.message_detail or ""
        if code == RATE_HOLD:
            try:
                seconds = float(detail)
            except ValueError:
                return
            with self._lock:
                self._hold = seconds if self._hold is None else min(self._hold, seconds)
            return
        with self._lock:
            if code == KEY_LOCKED:
                told, self._locked = detail in self._locked, self._locked | {detail}
            else:
                told = detail in self.report.unclaimable
                said = diag.message_primary or ""
                error = said.partition(_NOT_CHOSEN)[2] or said
                self.report.unclaimable.setdefault(
                    detail, one_line(redact(error), limit=ERROR_CHARS)
                )
        if told:
            return
        if code == KEY_LOCKED:
            self.log.warning(
                "a key of a limited job type is locked by another session",
                job_type=detail,
                hint="its runs wait until that session lets go; `jobrunner status` names it",
            )
        else:
            self.log.warning(
                "limited job type not claimed",
                job_type=detail,
                error=self.report.unclaimable[detail],
            )

    def held_back(self) -> float | None:
        """The rate's hold noted by the claim just taken, in seconds (None: none); forgotten
        once taken, as the next claim notes its own."""
        with self._lock:
            hold, self._hold = self._hold, None
        return hold
