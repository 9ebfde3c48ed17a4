"""The drain: the tick's one loop, passing values between its parts until the work is done.

Each pass: stop claiming if it is time; take the claim that came back and queue
its runs; start the next claim when there is room; give runs back when stopping;
collect what handlers returned and decide each run's fate; time out overrunning
handlers; write decisions that no claim will carry, or, once the drain streams,
take the writer's last write and start its next; renew leases. A drain whose
claims come back with fewer runs than asked ends once nothing is in flight, after one
more look, and one more again when outcomes were written that its last claim could not see
(`Batcher.follows_up`: they may have enqueued a batch's callback or made a waiting run due);
unless a rate holds due runs back until a moment before the deadline
(`Batcher.waits_for_rate`): it looks again then. The loop runs no
SQL and writes no log line of its own: the batcher and the lease keeper build the
statements, the connection keeper and the writer run them, and the tally tells
what happened.

A failed statement stops the claiming (`_failed`), whatever its kind: running
handlers get the grace period, and what the tick holds is written and handed back
once the connection keeper has done what it can (reconnected, or moved to a server
that takes writes). A refusal makes the stop urgent: no handler is waited for, since
nothing it returns could be recorded, and each write is tried once. A statement
rejected for its own rows (a claim whose row broke a constraint) refuses nothing
else: the handlers running under their leases are never abandoned for it, and their
outcomes are written as at any other stop. Writes and heartbeats that failed wait
`RETRY_PAUSE` before the loop tries them again, so a database that fails every
statement at once is not asked in a busy loop.

A tick that stays (`--listen`) has a listener: where a drain would end, with nothing in
flight and the last claim short, it writes what is decided, closes the writer (one
connection while it waits) and asks the listener what next (`tick/listen.py`): claim again,
run the step a schedule's time needs first (`time_steps`: materialize), or stop. While
handlers run and the last claim came short, it asks between passes whether to claim again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from uuid import UUID

from cronjob import transitions
from cronjob.models import Decision
from cronjob.tick.batcher import Batcher
from cronjob.tick.connection import ConnectionKeeper, ReconnectFailed, StatementFailed
from cronjob.tick.execute import timed_out
from cronjob.tick.flight import Flight, FlightState, Result
from cronjob.tick.leases import LeaseKeeper
from cronjob.tick.listen import Listener, Wake
from cronjob.tick.notes import ClaimNotes
from cronjob.tick.pool import Pool
from cronjob.tick.shutdown import Shutdown
from cronjob.tick.tally import Tally
from cronjob.tick.writer import STREAMING_CLAIM, Writer

# How long a hand-back waits for handlers that already returned to finish their
# own bookkeeping (committing `ctx.db`), so their outcome is not thrown away.
FINISHING_WAIT = 2.0
IDLE_WAIT = 0.05  # how long a pass waits for a handler to return when it cannot claim
# With a listener, while handlers run: how long before the pass asks it again whether
# runs came (a notification is read between passes, not while one waits).
LISTENING_WAIT = 0.01
RETRY_PAUSE = 1.0  # after a failed statement, how long writes and heartbeats wait


class Drain:
    """Claims, runs and records runs until none is due, the deadline passes or a stop comes."""

    def __init__(
        self,
        *,
        connection: ConnectionKeeper,
        batcher: Batcher,
        pool: Pool,
        leases: LeaseKeeper,
        shutdown: Shutdown,
        tally: Tally,
        writer: Writer,
        notes: ClaimNotes,
        listener: Listener | None = None,
        time_steps: Callable[[], None] | None = None,
    ) -> None:
        self.connection, self.writer, self.batcher, self.notes = connection, writer, batcher, notes
        self.pool, self.leases, self.shutdown, self.tally = pool, leases, shutdown, tally
        self.stay = None if listener is None else Stay(listener, time_steps, tally, shutdown)
        self._quiet_until = 0.0  # no write or heartbeat before then: one just failed
        self._idle_wait = IDLE_WAIT if listener is None else LISTENING_WAIT

    def run(self, deadline: float) -> None:
        """Drain until done; the tally then knows what became of every run claimed.

        Raises `ConnectionLost` when the connection was lost and could not be re-opened.
        """
        try:
            while True:
                try:
                    if not self._pass(deadline):
                        break
                except StatementFailed as failed:
                    if not self._listening_goes_on(failed):
                        self._failed(failed)
            self._let_stopping_handlers_return()
            self._write_the_rest()
            self.tally.unrecorded(len(self.batcher.decisions))
            for held in self.leases.hand_back_lost_claims(self.connection):
                self.tally.claim_recovered(held)
        except ReconnectFailed as exc:
            self.pool.settle_all({FlightState.QUEUED, FlightState.STARTED})
            raise self.tally.connection_lost(str(exc)) from None
        finally:
            self.pool.stop()
            self.writer.close()

    def _listening_goes_on(self, failed: StatementFailed) -> bool:
        """A tick that stays, with nothing in flight and nothing to write, whose connection was
        lost (and re-opened by the keeper) listens again rather than stop: its next claim finds
        what was enqueued meanwhile."""
        return (
            self.stay is not None
            and failed.retryable
            and not self.shutdown.requested
            and not self.pool.flights
            and not self.batcher.decisions
            and not self.connection.busy
        )

    def _failed(self, failed: StatementFailed) -> None:
        """Stop claiming; after a refusal of the tick, at once. Told to the tally, which ends
        the tick."""
        self.shutdown.request("database error", urgent=failed.refuses_the_tick)
        self.tally.database_failed(failed)
        self._quiet_until = time.monotonic() + RETRY_PAUSE

    def _pass(self, deadline: float) -> bool:
        """One pass of the loop; False when the drain is over."""
        batcher, pool = self.batcher, self.pool
        now = time.monotonic()
        if now >= deadline:
            self.shutdown.request("max-runtime", now=now)
        if self.connection.finished:
            self._take_claim()
        if self.shutdown.requested:
            self._stop_claiming()
            if self.shutdown.grace_spent(now):
                self._hand_back_unfinished()
                return False
        elif batcher.may_claim(len(pool.flights), now):
            claim = batcher.claim(len(pool.flights), now, carry=not self.writer.active)
            # A listening tick woken with nothing in flight has nothing to do meanwhile.
            inline = self.stay is not None and not pool.flights
            self.connection.begin("claim", claim, then=pool.wake, inline=inline)
        # The writer's last writes too, in the loop: what they finish may make runs due that
        # one more claim then takes (`Batcher.follows_up`).
        writing = self.writer.active and (self.writer.busy or bool(batcher.decisions))
        idle = not pool.flights and not self.connection.busy and not writing
        if idle and (
            self.shutdown.requested
            or (
                batcher.exhausted
                and not batcher.decisions  # their write may enqueue a callback: written first
                and not batcher.waits_for_rate(deadline)
                and not batcher.follows_up()
            )
        ):
            if self.stay is None or self.shutdown.requested:
                return False
            self._write_the_rest()
            self.writer.close()  # opened again by the next claim that comes back full
            return self.stay.listen(deadline, self.batcher)
        # Block for a result (or the claim under way) unless there is room to claim now; no
        # longer than a rate holds due runs back.
        may_claim = batcher.may_claim(len(pool.flights), now)
        wait = 0.0 if may_claim else batcher.wait_at_most(now, self._idle_wait)
        record(pool.collect(wait), batcher, self.tally)
        now = time.monotonic()
        time_out(pool, batcher, self.tally, now)
        self.tally.event_loop_blocked(pool.blocking(now))
        if now >= self._quiet_until:  # else a statement just failed: decisions wait, leases hold
            self._write_and_renew(now)
        if batcher.exhausted and not self.connection.busy:
            if batcher.held_until is not None:
                if not batcher.held(now):  # a rate's next start: whatever is still in flight
                    batcher.look_again()
            elif self._look_again(now):
                batcher.look_again()
        return True

    def _look_again(self, now: float) -> bool:
        """Everything claimed is done (retries may be due already); or, listening, runs may
        have come while handlers run. A listening tick with nothing in flight asks its
        listener instead, which looks for due runs before it sleeps."""
        if self.stay is None:
            return not self.pool.flights
        return bool(self.pool.flights) and self.stay.listener.between(now)

    def _write_and_renew(self, now: float) -> None:
        batcher, pool = self.batcher, self.pool
        # A claim sent before the writer's connection opened may carry decisions still.
        if self.writer.active and not batcher.carrying:
            self._write()
        elif batcher.finalize_due(len(pool.flights), now):
            self._finalize()
        if pool.flights and self.leases.beat_due(now):
            self._renew(now)

    def _take_claim(self) -> None:
        try:
            kept, runs = self.connection.result()
        except StatementFailed:
            self.notes.held_back()  # of a claim that failed: none to wait for
            token, carried = self.batcher.claim_failed()
            recover_claim(token, carried, self.batcher, self.leases, self.connection, self.tally)
            raise
        self.tally.finalized(self.batcher.claimed(runs), kept)
        self.batcher.held_back(self.notes.held_back())  # a rate holding due runs back
        self.tally.claimed(len(runs))
        if len(runs) >= STREAMING_CLAIM and not self.batcher.exhausted:
            self.writer.open()
        for flight in self.pool.add(runs):  # held from an earlier claim: this tick stalled
            self.tally.claimed_again(flight.run)

    def _stop_claiming(self) -> None:
        """What no worker has started goes back at once; what runs gets the grace period."""
        if self.connection.busy:
            self._take_claim()
        if not self.batcher.closed:
            self.batcher.close()
            # A signal that finds a tick that stays with no handler running (asleep, or
            # claiming after a wake-up) ends it at once, as one asleep (tick's exit 143).
            listening = self.stay is not None and self.shutdown.signum is not None
            self.tally.report.stopped_listening = listening and not self.pool.running()
            if self.pool.flights:
                self.tally.stopping(self.shutdown.reason, self.pool.running(), self.shutdown.grace)
        self._hand_back(self.pool.settle_all({FlightState.QUEUED}))

    def _write(self) -> None:
        """Take the writer's last write if it is done; start the next with what is decided."""
        if self.writer.finished:
            self._written(*self.writer.result())
        if not self.writer.busy and self.batcher.decisions:
            decisions, write = self.batcher.finalize()
            self.writer.begin(decisions, write, then=self.pool.wake)

    def _finalize(self) -> None:
        decisions, write = self.batcher.finalize()
        self._written(decisions, self.connection.run("finalize", write))

    def _written(self, decisions: list[Decision], kept: set[int]) -> None:
        self.batcher.finalized(decisions)
        self.tally.finalized(decisions, kept)

    def _renew(self, now: float) -> None:
        if self.connection.busy:
            self._take_claim()  # its runs are leased afresh; the beat waits for the connection
        for flight in self.leases.renew(self.connection, list(self.pool.flights.values()), now):
            # Not when its handler returned: the fenced write tells what happened.
            if self.pool.settle(flight, await_return=True):
                ran = now - flight.started if flight.started is not None else 0.0
                self.tally.lease_lost(flight.run, ran)

    def _hand_back_unfinished(self) -> None:
        record(self.pool.collect(0), self.batcher, self.tally)
        self._hand_back(self.pool.settle_all({FlightState.QUEUED, FlightState.STARTED}))
        # Handlers that returned are finishing their bookkeeping; record them
        # rather than lose a finished outcome, but never wait long.
        until = time.monotonic() + FINISHING_WAIT
        while self.pool.flights and time.monotonic() < until:
            record(self.pool.collect(IDLE_WAIT), self.batcher, self.tally)

    def _hand_back(self, flights: list[Flight]) -> None:
        if not flights:
            return
        for attempt in range(2):  # once more, on the fresh connection if it was lost
            try:
                held = self.leases.hand_back(self.connection, flights)
                break
            except StatementFailed as failed:
                self._failed(failed)
                if attempt or not failed.retryable:
                    self.tally.unrecorded(len(flights))
                    return
        self.tally.handed_back([f.run for f in flights], held, self.shutdown.reason)

    def _let_stopping_handlers_return(self) -> None:
        """Handlers told to stop (run cancelled, lease lost) get --grace to clean up and return.

        Leaving sooner would end the process under them. One that ignores
        ctx.cancelled is abandoned when the grace period is over, as at shutdown.
        """
        if not self.pool.stopping:
            return
        self._write_the_rest()  # first: no lease of a run already decided is renewed meanwhile
        self.tally.waiting_for_stopping(len(self.pool.stopping), self.shutdown.grace)
        until = time.monotonic() + self.shutdown.grace
        if self.shutdown.requested:  # one grace period per stop, shared with running handlers
            until = min(until, self.shutdown.at + self.shutdown.grace)
        while self.pool.stopping and time.monotonic() < until and not self.shutdown.urgent:
            record(self.pool.collect(IDLE_WAIT), self.batcher, self.tally)

    def _write_the_rest(self) -> None:
        """The writer's last write, then what is still decided, on the tick's own connection."""
        if self.writer.busy:
            try:
                self._written(*self.writer.result())
            except StatementFailed as failed:
                self._failed(failed)
        for _ in range(2):  # once more, on the fresh connection if it was lost
            if not self.batcher.decisions:
                return
            try:
                self._finalize()
            except StatementFailed as failed:
                self._failed(failed)
                if not failed.retryable:
                    return


class Stay:
    """A tick that stays (`--listen`): where a drain would end, it asks its listener what next
    (`tick/listen.py`): claim again, run the step a schedule's time needs first
    (`time_steps`: materialize), or stop."""

    def __init__(
        self,
        listener: Listener,
        time_steps: Callable[[], None] | None,
        tally: Tally,
        shutdown: Shutdown,
    ) -> None:
        self.listener, self._time_steps = listener, time_steps
        self._tally, self._shutdown = tally, shutdown
        self._claimed_before = 0  # runs claimed when the listener was last asked

    def listen(self, deadline: float, batcher: Batcher) -> bool:
        """Nothing to do: wait, as the listener says, for something to claim; False to stop."""
        claimed = self._tally.report.claimed
        fresh, self._claimed_before = claimed - self._claimed_before, claimed
        wake = self.listener.idle(deadline, claimed=fresh)
        if wake is Wake.STOP:
            # Nothing in flight: a signal now ends the tick at once (tick's exit 143).
            self._tally.report.stopped_listening = self._shutdown.signum is not None
            return False
        if wake is Wake.TIME and self._time_steps is not None:
            self._time_steps()
        batcher.look_again(in_full=True)
        return True


def recover_claim(
    token: UUID,
    carried: int,
    batcher: Batcher,
    leases: LeaseKeeper,
    connection: ConnectionKeeper,
    tally: Tally,
) -> None:
    """Hand back what a failed claim holds, if its commit took effect after all.

    When nothing shows it did, the decisions it carried stay in the buffer and the
    next write carries them again, fenced; the lease keeper tries the claim's token
    once more at the end of the drain.
    """
    check = batcher.written_check(carried)
    held, found = leases.recover_claim(connection, token, check)
    if not held and not found:
        return
    written = batcher.written_after_all(carried)
    # Landed, and the check failed: as a rule, every decision it carried was written.
    kept = found if found is not None else {d.run.id for d in written}
    tally.finalized(written, kept)
    if held:
        tally.claim_recovered(held)


def record(results: list[Result], batcher: Batcher, tally: Tally) -> None:
    """What handlers returned, as decisions for the batcher to write (those that committed
    their own outcome in `ctx.db` are told to the tally as done)."""
    if not results:
        return
    decide, decisions = transitions.decide, []
    for result in results:
        flight = result.flight
        if result.finalized:
            tally.committed_by_handler(flight.run, result.duration, result.kept)
        else:
            decisions.append(
                decide(
                    flight.run, result.outcome, flight.spec.backoff, result.duration, flight.logs
                )
            )
    batcher.returned(len(results))
    batcher.decided(*decisions)


def time_out(pool: Pool, batcher: Batcher, tally: Tally, now: float) -> None:
    """Runs past their handler's timeout, decided as timed out."""
    for flight in pool.overdue(now):
        timeout = flight.spec.timeout
        assert timeout is not None and flight.started is not None
        outcome, ran = timed_out(timeout), now - flight.started
        # What it logged so far goes with the timeout; what it logs later, nowhere.
        decision = transitions.decide(flight.run, outcome, flight.spec.backoff, ran, flight.logs)
        batcher.decided(decision)
        tally.timed_out(flight.run, timeout)
