"""The drain: the tick's one loop, passing values between its parts until the work is done.

Each pass: stop claiming if it is time; take the claim that came back and queue
its runs; start the next claim when there is room; give runs back when stopping;
collect what handlers returned and decide each run's fate; time out overrunning
handlers; write decisions that no claim will carry; renew leases. The loop runs no
SQL of its own: the producer and the lease keeper build the statements, the
connection keeper runs them.
"""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

from cronjob import transitions
from cronjob.models import Errored
from cronjob.tick.connection import ConnectionKeeper, ReconnectFailed, StatementFailed
from cronjob.tick.leases import LeaseKeeper
from cronjob.tick.pool import Flight, FlightState, Pool
from cronjob.tick.producer import Producer
from cronjob.tick.shutdown import Shutdown
from cronjob.tick.tally import Tally

# How long a hand-back waits for handlers that already returned to finish their
# own bookkeeping (committing `ctx.db`), so their outcome is not thrown away.
SETTLE_WAIT = 2.0
IDLE_WAIT = 0.05  # how long a pass waits for a handler to return when it cannot claim


class Drain:
    """Claims, runs and records runs until none is due, the deadline passes or a stop comes."""

    def __init__(
        self,
        *,
        connection: ConnectionKeeper,
        producer: Producer,
        pool: Pool,
        leases: LeaseKeeper,
        shutdown: Shutdown,
        tally: Tally,
    ) -> None:
        self.connection = connection
        self.producer = producer
        self.pool = pool
        self.leases = leases
        self.shutdown = shutdown
        self.tally = tally

    def run(self, deadline: float) -> None:
        try:
            while True:
                try:
                    if not self._pass(deadline):
                        break
                except StatementFailed:
                    self.shutdown.request("database error")
            self._finalize_the_rest()
            self._let_stopping_handlers_return()
        except ReconnectFailed as exc:
            self.pool.settle_all({FlightState.QUEUED, FlightState.STARTED})
            raise self.tally.connection_lost(str(exc)) from None
        finally:
            self.pool.stop()
        self.tally.require_recorded()

    def _pass(self, deadline: float) -> bool:
        """One pass of the loop; False when the drain is over."""
        producer, pool = self.producer, self.pool
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
        elif producer.may_claim(len(pool.flights), now):
            self.connection.begin("claim", producer.claim(len(pool.flights), now), then=pool.wake)
        idle = not pool.flights and not self.connection.busy
        if idle and (producer.exhausted or self.shutdown.requested):
            return False
        # Block for a result (or the claim under way) unless there is room to claim now.
        wait = 0.0 if producer.may_claim(len(pool.flights), now) else IDLE_WAIT
        self._record(pool.collect(wait))
        now = time.monotonic()
        self._time_out(now)
        if producer.finalize_due(len(pool.flights), now):
            self._finalize()
        if pool.flights and self.leases.beat_due(now):
            self._renew(now)
        if producer.exhausted and not pool.flights and not self.connection.busy:
            producer.look_again()
        return True

    def _take_claim(self) -> None:
        try:
            kept, runs = self.connection.result()
        except StatementFailed:
            self._recover_claim(self.producer.claim_failed())
            raise
        self.tally.finalized(self.producer.claimed(runs), kept)
        self.tally.report.claimed += len(runs)
        self.pool.add(runs)

    def _recover_claim(self, token: UUID) -> None:
        """Hand back what a failed claim holds, if its commit took effect after all."""
        try:
            held = self.leases.hand_back_claim(self.connection, token)
        except StatementFailed:
            return  # its runs, if any, are rescued once their leases expire
        if held:
            self.tally.claim_recovered(held)

    def _stop_claiming(self) -> None:
        """What no worker has started goes back at once; what runs gets the grace period."""
        if self.connection.busy:
            self._take_claim()
        if not self.producer.closed:
            self.producer.closed = True
            if self.pool.flights:
                self.tally.log.info(
                    "stopping: claiming nothing more",
                    reason=self.shutdown.reason,
                    running=self.pool.running(),
                    grace_s=self.shutdown.grace,
                )
        self._hand_back(self.pool.settle_all({FlightState.QUEUED}))

    def _record(self, results: list[Any]) -> None:
        for result in results:
            flight = result.flight
            self.producer.returned()
            if result.finalized:
                self.tally.committed_by_handler(flight.run, result.duration, result.kept)
            else:
                self.producer.decided(transitions.decide(
                    flight.run, result.outcome, flight.spec.backoff, result.duration
                ))  # fmt: skip

    def _time_out(self, now: float) -> None:
        for flight in self.pool.overdue(now):
            timeout = flight.spec.timeout
            assert timeout is not None and flight.started is not None
            error = Errored("timeout", f"handler still running after its {timeout:g}s timeout")
            self.producer.decided(transitions.decide(
                flight.run, error, flight.spec.backoff, now - flight.started
            ))  # fmt: skip
            self.tally.timed_out(flight.run, timeout)

    def _finalize(self) -> None:
        decisions, write = self.producer.finalize()
        kept = self.connection.run("finalize", write)
        self.producer.finalized(decisions)
        self.tally.finalized(decisions, kept)

    def _renew(self, now: float) -> None:
        if self.connection.busy:
            self._take_claim()  # its runs are leased afresh; the beat waits for the connection
        for flight in self.leases.renew(self.connection, list(self.pool.flights.values()), now):
            # Not when its handler returned: the fenced write tells what happened.
            if self.pool.settle(flight, await_return=True):
                ran = now - flight.started if flight.started is not None else 0.0
                self.tally.lost(flight.run, ran, because="lease lost (run cancelled, or claimed "
                                "by another tick after this one stalled); the handler is told "
                                "through ctx.cancelled")  # fmt: skip

    def _hand_back_unfinished(self) -> None:
        self._record(self.pool.collect(0))
        self._hand_back(self.pool.settle_all({FlightState.QUEUED, FlightState.STARTED}))
        # Handlers that returned are finishing their bookkeeping; record them
        # rather than lose a finished outcome, but never wait long.
        until = time.monotonic() + SETTLE_WAIT
        while self.pool.flights and time.monotonic() < until:
            self._record(self.pool.collect(IDLE_WAIT))

    def _hand_back(self, flights: list[Flight]) -> None:
        if not flights:
            return
        for attempt in range(2):  # once more, on the fresh connection if it was lost
            try:
                held = self.leases.hand_back(self.connection, flights)
                break
            except StatementFailed:
                self.shutdown.request("database error")
                if attempt:
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
        self.tally.log.info(
            "waiting for handlers told to stop", count=len(self.pool.stopping),
            grace_s=self.shutdown.grace,
        )  # fmt: skip
        until = time.monotonic() + self.shutdown.grace
        while self.pool.stopping and time.monotonic() < until and not self.shutdown.urgent:
            self.pool.collect(IDLE_WAIT)

    def _finalize_the_rest(self) -> None:
        for _ in range(2):  # once more, on the fresh connection if it was lost
            if not self.producer.decisions:
                return
            try:
                self._finalize()
            except StatementFailed:
                self.shutdown.request("database error")
        self.tally.unrecorded(len(self.producer.decisions))
