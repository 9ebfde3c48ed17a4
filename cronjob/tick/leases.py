"""The lease keeper: heartbeats, lost leases and hand-back.

The fencing rule. A claim gives each run a lease: a token that names the claim,
and a time until which the run is this tick's. Every write the tick makes about a
run — renewing the lease, recording an outcome, handing it back, the handler's
own success commit in `ctx.db` — names the token and matches the row only while
the run is still `running` under that same token. A run that was cancelled, handed
back, or rescued and claimed again by another tick after this one stalled no
longer matches: the write changes nothing, and the tick learns the lease is lost
from the ids that did not come back. So whatever a stalled or partitioned tick
does later, it can never overwrite what happened to the run meanwhile.

Heartbeats renew every lease the tick holds, for runs running and runs waiting
for a worker alike, every third of the shortest lease: two beats can fail before
any lease runs out. A run whose lease did not renew is lost: its handler is told
through `ctx.cancelled` and its outcome is discarded. A hand-back makes runs that
never started (or are given up at shutdown) due again at once, with the attempt not
counted: `queued`, or `failed` when an earlier attempt of theirs did run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any
from uuid import UUID

from cronjob import store
from cronjob.db import describe
from cronjob.handlers import HandlerSpec
from cronjob.tick.connection import ConnectionKeeper, StatementFailed
from cronjob.tick.flight import Flight


class LeaseKeeper:
    """When to renew leases, the statements that renew them or hand runs back, and the
    claims whose answer was lost."""

    def __init__(
        self,
        handlers: dict[str, HandlerSpec],
        *,
        lease: float | None = None,
        now: datetime | None = None,
        clock: Callable[[], float] = time.monotonic,
        log: Any = None,
    ) -> None:
        self.override = lease  # --lease: every run gets this one, whatever its handler says
        self.leases = {job_type: self.lease(spec) for job_type, spec in handlers.items()}
        self.every = min(self.leases.values(), default=60.0) / 3
        self._now = now
        self._last_beat = clock()
        self._log = log
        self._lost_claims: list[UUID] = []  # failed claims in which nothing was found held

    def lease(self, spec: HandlerSpec) -> float:
        return self.override if self.override is not None else spec.lease

    def beat_due(self, now: float) -> bool:
        return now - self._last_beat >= self.every

    def renew(
        self, connection: ConnectionKeeper, flights: Sequence[Flight], now: float
    ) -> list[Flight]:
        """Renew the leases of `flights`; returns those whose lease was not renewed (lost).

        A beat the database fails raises, and is tried again on the next pass.
        """
        import psycopg

        locked = (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected)
        if not flights:
            return []
        beat = partial(
            store.runs_heartbeat_many,
            runs=[f.run for f in flights],
            leases=[self.leases[f.run.job_type] for f in flights],
            now=self._now,
        )
        try:
            held = connection.run("heartbeat", beat, passing=locked)
        except locked as exc:
            # Only a handler that locks job_runs rows in its own ctx.db transaction
            # can hold one long; the leases have two thirds left: try next beat.
            self._log.warning("heartbeat skipped: a run's row is locked", error=describe(exc))
            held = None
        self._last_beat = now
        if held is None:
            return []
        return [f for f in flights if f.run.id not in held]

    def hand_back_claim(self, connection: ConnectionKeeper, token: UUID) -> list[int]:
        """Return to the queue whatever one claim holds, by its token; returns their ids.

        For a claim whose commit took effect while its answer was lost (a failover, a
        restart, a network cut at that instant): none of its runs was started, so none
        is charged an attempt, as with any other hand-back.
        """
        return connection.run(
            "hand back", partial(store.runs_hand_back_claim, token=token, now=self._now)
        )

    def recover_claim(
        self, connection: ConnectionKeeper, token: UUID, written_check: Callable[[Any], set[int]]
    ) -> tuple[list[int], set[int] | None]:
        """For a claim whose answer was lost: what it held, handed back (`hand_back_claim`),
        and which of the decisions it carried it wrote (`written_check`; None: not known).
        Either one found proves its commit landed; a failed statement finds nothing.

        Finding nothing proves nothing when the old connection may still be committing:
        the token is kept, and tried once more by `hand_back_lost_claims`.
        """
        held: list[int] = []
        found: set[int] | None = None
        with contextlib.suppress(StatementFailed):
            held = self.hand_back_claim(connection, token)
        with contextlib.suppress(StatementFailed):
            found = connection.run("check", written_check)
        if not held and not found:
            self._lost_claims.append(token)
        return held, found

    def hand_back_lost_claims(self, connection: ConnectionKeeper) -> list[list[int]]:
        """At the end of the drain, what the claims in which `recover_claim` found nothing
        hold by now, handed back: the ids of each claim that held some."""
        found = []
        for token in self._lost_claims:
            with contextlib.suppress(StatementFailed):  # then the leases expire, as before
                if held := self.hand_back_claim(connection, token):
                    found.append(held)
        return found

    def hand_back(self, connection: ConnectionKeeper, flights: Sequence[Flight]) -> set[int]:
        """Return `flights` to the queue, attempt not counted; returns the ids still held."""
        hand_back = partial(store.runs_hand_back_many, runs=[f.run for f in flights], now=self._now)
        return connection.run("hand back", hand_back)
