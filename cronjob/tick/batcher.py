"""The batcher: how many runs to claim and when, and the decisions waiting to be written,
batched into the statements that claim and finalize.

Pacing. A tick keeps about `CLAIM_HORIZON` seconds of work claimed beyond its
concurrency, measured by how fast its handlers return, and never more than
`--batch-size`: enough to keep the workers going through a claim's round trip, few
enough that slow runs stay claimable by other hosts.

The decision buffer. What handlers' outcomes mean for their runs (`Decision`s)
waits here until a statement writes it: the next claim carries the decisions so
far in its own commit (finalize-and-claim), or, when no claim is due, they are
written on their own at least every `FLUSH_INTERVAL`. A streaming drain writes
them apart from its claims instead, on a second connection (tick/writer.py), and
its claims carry none. Decisions leave the buffer only once written; a statement
that failed leaves them for the next one, which is safe because every write is
fenced by the lease token.

The batcher builds the statements; the connection keeper or the writer runs them.
"""

from __future__ import annotations

import math
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from cronjob import store
from cronjob.handlers import HandlerSpec
from cronjob.models import ClaimedRun, Decision
from cronjob.tick.resume import Resume

CLAIM_HORIZON = 1.0
FLUSH_INTERVAL = 0.2  # write decisions at least this often while handlers run
# Ticks on several hosts held back by the same rate would all look again at the same instant
# and meet on the key's lock: each looks up to this much later (or a twentieth of its wait).
# Small: whatever a claim comes later than a key's next start is lost to the rate.
HOLD_JITTER = 0.005

Claim = Callable[[Any], tuple[set[int], list[ClaimedRun]]]
Finalize = Callable[[Any], set[int]]


@dataclass
class Pace:
    """Runs whose handlers returned per second: the last full second, or this one so far."""

    count: int = 0
    since: float = field(default_factory=time.monotonic)
    previous: float | None = None

    def per_second(self, now: float) -> float | None:
        elapsed = now - self.since
        if elapsed >= 1.0:
            self.previous = self.count / elapsed
            self.count, self.since = 0, now
            return self.previous
        current = self.count / max(elapsed, 0.1) if self.count else None
        known = [rate for rate in (current, self.previous) if rate is not None]
        return max(known) if known else None


class Batcher:
    """Claim pacing and the decision buffer of one tick."""

    def __init__(
        self,
        handlers: dict[str, HandlerSpec],
        *,
        leases: dict[str, float],
        concurrency: int,
        batch_size: int,
        worker: str,
        now: datetime | None = None,
        clock: Callable[[], float] = time.monotonic,
        flushed_claims: bool = True,
    ) -> None:
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.decisions: list[Decision] = []
        self.exhausted = False  # the last claim found fewer runs than it asked for
        # When the earliest due run a rate held back at the last claim may start (monotonic
        # clock): an exhausted drain waits for it rather than end (`waits_for_rate`).
        self.held_until: float | None = None
        self._claim_sent = clock()  # when the claim last taken was sent
        # Outcomes written that no claim has looked past yet: the finish of a batch's last
        # member enqueues its callback, a parent's makes its waiting runs due (migration
        # 0026), and a claim whose snapshot predates that write does not see them.
        self.unseen_writes = False
        self._written_at = float("-inf")  # when outcomes were last written apart
        self.closed = False  # stopping: nothing more is claimed
        self.pace = Pace(since=clock())
        self._worker = worker
        self._now = now
        self._clock = clock
        # A claim under way: the decisions it carries, its limit, its lease token, whether it
        # resumes and when it was sent.
        self._sent: tuple[int, int, uuid.UUID, bool, float] | None = None
        # The last run the last claim handed over: the next claim goes on round-robin from
        # its tenant.
        self._after: ClaimedRun | None = None
        self._resume = Resume()
        self._last_flush = clock()
        types = sorted(handlers)
        self._claim_args = {
            # A listening tick's claims that carry no outcome do not wait for the disk
            # (queries.runs.RUNS_CLAIM_MANY_PLAN_UNFLUSHED): it starts the run sooner.
            "flushed": flushed_claims,
            "job_types": types,
            "leases": [leases[t] for t in types],
            "max_attempts": [handlers[t].max_attempts for t in types],
        }

    # -- claiming -------------------------------------------------------------

    def backlog(self, now: float) -> int:
        """How many claimed runs may wait for a worker: what the workers start in CLAIM_HORIZON."""
        rate = self.pace.per_second(now)
        if rate is None:
            return min(self.batch_size, self.concurrency)
        return max(1, min(self.batch_size, math.ceil(rate * CLAIM_HORIZON)))

    def may_claim(self, in_flight: int, now: float) -> bool:
        """Whether a claim is worth its round trip now, with `in_flight` runs held."""
        if self.closed or self.exhausted or self._sent is not None:
            return False
        backlog = self.backlog(now)
        room = self.concurrency + backlog - in_flight
        return room >= max(1, backlog // 2) or in_flight == 0

    def claim(self, in_flight: int, now: float, *, carry: bool = True) -> Claim:
        """The next claim: room for the backlog, carrying every decision so far unless
        they are written apart (`carry` false)."""
        limit = min(self.concurrency + self.backlog(now) - in_flight, self.batch_size)
        decisions = list(self.decisions) if carry else []
        token = uuid.uuid4()
        sent = self._clock()
        floors = self._resume.floors_for(sent)
        self._sent = (len(decisions), limit, token, floors is not None, sent)
        return partial(
            store.runs_finalize_and_claim_many,
            decisions=decisions,
            limit=limit,
            token=token,
            after=self._after,
            floors=floors,
            worker=self._worker,
            now=self._now,
            **self._claim_args,
        )

    @property
    def carrying(self) -> bool:
        """A claim under way carries decisions: none is written apart until it is back."""
        return self._sent is not None and self._sent[0] > 0

    def claimed(self, runs: list[ClaimedRun]) -> list[Decision]:
        """The claim under way committed: returns the decisions it wrote."""
        assert self._sent is not None
        (carried, limit, _token, resumed, sent), self._sent = self._sent, None
        self._claim_sent = sent
        # Only a full claim sees everything due: one that resumed and came back short is
        # followed by a full one (tick/resume.py).
        self.exhausted = len(runs) < limit and not resumed
        self.unseen_writes = carried > 0 or self._written_at >= sent
        self._resume.took(runs, limit=limit, resumed=resumed, sent=sent, now=self._clock())
        if runs:
            self._after = runs[-1]
        return self.written_after_all(carried)

    def claim_failed(self) -> tuple[uuid.UUID, int]:
        """The claim under way failed: its decisions wait for the next write.

        Returns its lease token and how many decisions it carried: the claim may have
        committed all the same, with only its answer lost, and whatever it holds is
        found by that token.
        """
        assert self._sent is not None
        (carried, _limit, token, _resumed, _at), self._sent = self._sent, None
        return token, carried

    def written_check(self, carried: int) -> Finalize:
        """The statement that finds which of the `carried` oldest decisions a claim whose
        answer was lost wrote: the ids it returns are those."""
        return partial(
            store.runs_list_decided, decisions=self.decisions[:carried], worker=self._worker
        )

    def written_after_all(self, carried: int) -> list[Decision]:
        """A claim committed, its answer lost or not: the `carried` oldest decisions are written."""
        written, self.decisions = self.decisions[:carried], self.decisions[carried:]
        return written

    def close(self) -> None:
        """Stopping: nothing more is claimed."""
        self.closed = True

    def follows_up(self) -> bool:
        """Whether an exhausted drain looks once more before it ends: outcomes were written
        that its last claim could not see, which may have made runs due (a batch's callback,
        a run waiting for its parents)."""
        # Writes apart (the writer's) may end after the last claim came back: they count too.
        unseen = self.unseen_writes or self._written_at >= self._claim_sent
        if not unseen or self.closed:
            return False
        self.unseen_writes = False
        self.look_again()
        return True

    def look_again(self, *, in_full: bool = False) -> None:
        """Everything claimed is done: look once more, since retries may be due already.

        `in_full`: with a full claim (a listening tick woken up): one that resumed and came
        back short would be followed by a full one at once, a round trip more before it sleeps.
        """
        self.exhausted = False
        self.held_until = None
        if in_full:
            self._resume.full_due = True

    def held_back(self, seconds: float | None) -> None:
        """The claim just taken said a rate holds due runs back for `seconds` more (None: no
        rate does), from its own clock: about when it was sent. A tick whose clock is pinned
        waits for nothing: its time never passes."""
        if seconds is None or self._now is not None:
            self.held_until = None
            return
        jitter = random.uniform(0.0, min(HOLD_JITTER, seconds / 20))
        self.held_until = self._claim_sent + seconds + jitter

    def held(self, now: float) -> bool:
        """A rate holds due runs back until later than `now`."""
        return self.held_until is not None and now < self.held_until

    def wait_at_most(self, now: float, idle_wait: float) -> float:
        """How long a pass that cannot claim may wait for a handler: `idle_wait`, or less
        when a rate's held-back runs may start sooner."""
        if self.exhausted and self.held_until is not None:
            return max(0.0, min(idle_wait, self.held_until - now))
        return idle_wait

    def waits_for_rate(self, deadline: float) -> bool:
        """Exhausted, but a rate's held-back runs may start before `deadline`: worth staying
        for, as a rate that spaces its starts would otherwise start one a tick."""
        return self.exhausted and self.held_until is not None and self.held_until < deadline

    # -- deciding and writing -------------------------------------------------

    def returned(self, count: int = 1) -> None:
        """Handlers returned: they count for the pace."""
        self.pace.count += count

    def decided(self, *decisions: Decision) -> None:
        self.decisions.extend(decisions)

    def finalize_due(self, in_flight: int, now: float) -> bool:
        """Whether the decisions so far are to be written on their own now.

        Not when a claim is under way or due right away: that claim carries them.
        """
        if not self.decisions or not (
            len(self.decisions) >= self.batch_size
            or self.exhausted
            or now - self._last_flush >= FLUSH_INTERVAL
        ):
            return False
        self._last_flush = now
        return self._sent is None and not self.may_claim(in_flight, now)

    def finalize(self) -> tuple[list[Decision], Finalize]:
        """The decisions so far, and the statement that writes them."""
        decisions = list(self.decisions)
        op = partial(
            store.runs_finalize_many, decisions=decisions, worker=self._worker, now=self._now
        )
        return decisions, op

    def finalized(self, decisions: list[Decision]) -> None:
        """`decisions`, the oldest in the buffer, are written."""
        del self.decisions[: len(decisions)]
        if decisions:
            self._written_at = self._clock()
