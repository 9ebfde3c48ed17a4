"""What one tick did: the summary line, and the numbers tests read.

Kept apart from models.py so an idle tick, which reports zeros, imports only this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUMMARY_IDS = 100  # run ids named in one summary or log line, at most


@dataclass
class TickReport:
    """What one tick did, for the summary line and for tests."""

    materialized: int = 0
    rescued: int = 0
    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    lost: int = 0  # outcome discarded: lease lost, run cancelled or re-claimed
    handed_back: int = 0
    handed_back_ids: list[int] = field(default_factory=list)
    # Claimed, but neither finalized nor handed back because the database failed:
    # recovered by a later tick once their leases expire.
    unrecorded: int = 0
    stopped_by: str | None = None
    # A tick that stays (--listen) was stopped by a signal while it waited, nothing in flight.
    stopped_listening: bool = False
    elapsed: float = 0.0
    pruned: int | None = None  # finished runs pruned after the tick, when it prunes
    # Due schedules that could not be materialized (materialize.Problem); all else was done.
    problems: list[Any] = field(default_factory=list)
    # Limited job types whose runs the claims could not choose (tick/notes.py), with why;
    # every other type was claimed.
    unclaimable: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "materialized": self.materialized,
            "rescued": self.rescued,
            "claimed": self.claimed,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "dead": self.dead,
            "lost": self.lost,
            "handed_back": self.handed_back,
            **(
                {"handed_back_ids": self.handed_back_ids[:SUMMARY_IDS]}
                if self.handed_back_ids
                else {}
            ),
            **({"unrecorded": self.unrecorded} if self.unrecorded else {}),
            "elapsed_s": round(self.elapsed, 3),
            **({"stopped_by": self.stopped_by} if self.stopped_by else {}),
            **({"pruned": self.pruned} if self.pruned is not None else {}),
            **({"unclaimable": sorted(self.unclaimable)} if self.unclaimable else {}),
        }
