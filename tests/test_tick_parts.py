"""The tick's parts on their own, without a database: the pool's state machine, the
batcher's pacing and decision buffer, the lease keeper's cadence and verdicts."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

from cronjob import transitions
from cronjob.db import Database
from cronjob.errors import JobrunnerError
from cronjob.handlers import HandlerSpec
from cronjob.models import ClaimedRun
from cronjob.tick.batcher import CLAIM_HORIZON, Batcher
from cronjob.tick.connection import ConnectionKeeper, Failure, StatementFailed
from cronjob.tick.flight import Flight, FlightState
from cronjob.tick.leases import LeaseKeeper
from cronjob.tick.pool import Pool
from cronjob.tick.shutdown import Shutdown


def claimed(run_id: int, job_type: str = "t") -> ClaimedRun:
    return ClaimedRun(
        id=run_id,
        job_type=job_type,
        payload={},
        tenant_id=None,
        scheduled_for=None,
        attempt=1,
        final_attempt=False,
        lease_token=uuid.uuid4(),
    )


def spec(job_type: str = "t", func: Any = None, **options: Any) -> HandlerSpec:
    return HandlerSpec(job_type, func or (lambda ctx, payload: None), **options)


class NoDatabase(Database):
    """The database of parts tested without one: nothing here opens a connection."""

    def __init__(self) -> None:
        super().__init__("postgresql:///never-connected")

    def connect(self, *, autocommit: bool = True) -> Any:
        raise AssertionError("nothing here opens a connection")


def pool_of(*specs: HandlerSpec, concurrency: int = 2) -> Pool:
    handlers = {s.job_type: s for s in specs}
    return Pool(handlers, concurrency=concurrency, database=NoDatabase(), worker="test:1")


def collect_all(pool: Pool, count: int, timeout: float = 10.0) -> list[Any]:
    results: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(results) < count:
        assert time.monotonic() < deadline, "the handlers did not return"
        results += pool.collect(0.05)
    return results


def wait_until_started(pool: Pool, *run_ids: int) -> None:
    deadline = time.monotonic() + 10
    while any(pool.flights[i].state is not FlightState.STARTED for i in run_ids):
        assert time.monotonic() < deadline, "the handlers did not start"
        time.sleep(0.01)


# -- the pool's in-flight states ------------------------------------------------


def test_a_run_whose_handler_returned_is_settled_by_collecting_its_result():
    pool = pool_of(spec())
    pool.add([claimed(1)])
    [result] = collect_all(pool, 1)
    assert (result.flight.state, result.flight.run.id, pool.flights) == (FlightState.SETTLED, 1, {})
    pool.stop()


def test_a_queued_run_that_is_settled_never_starts():
    gate = threading.Event()
    ran: list[int] = []
    pool = pool_of(
        spec(func=lambda ctx, payload: (gate.wait(10), ran.append(ctx.run_id))), concurrency=1
    )
    pool.add([claimed(1), claimed(2)])  # one worker: run 2 waits in the queue
    wait_until_started(pool, 1)
    [given_up] = pool.settle_all({FlightState.QUEUED})
    assert given_up.run.id == 2 and given_up.ctx.cancelled.is_set()
    gate.set()
    [result] = collect_all(pool, 1)
    assert result.flight.run.id == 1 and ran == [1]
    pool.stop()


def test_a_run_whose_handler_returned_cannot_be_settled_by_the_main_thread():
    # Its worker may be committing ctx.db: only collecting its result settles it.
    pool = pool_of(spec())
    flight = Flight(claimed(1), spec(), ctx=None, state=FlightState.DONE)  # type: ignore[arg-type]
    pool.flights[1] = flight
    assert pool.settle(flight) is False
    assert pool.settle_all({FlightState.QUEUED, FlightState.STARTED}) == []
    assert flight.state is FlightState.DONE and 1 in pool.flights


def test_a_result_that_comes_after_its_run_was_settled_is_discarded():
    gate = threading.Event()
    pool = pool_of(spec(func=lambda ctx, payload: gate.wait(10)))
    pool.add([claimed(1)])
    wait_until_started(pool, 1)
    flight = pool.flights[1]
    assert pool.settle(flight) and flight.ctx.cancelled.is_set()
    gate.set()
    assert pool.collect(10) == []  # returns once the late result arrived, and drops it
    assert flight.state is FlightState.SETTLED
    pool.stop()


def test_a_handler_told_to_stop_is_awaited_until_it_returns():
    gate = threading.Event()
    pool = pool_of(spec(func=lambda ctx, payload: gate.wait(10)))
    pool.add([claimed(1), claimed(2)])
    wait_until_started(pool, *pool.flights)
    told = pool.flights[1]
    assert pool.settle(told, await_return=True)
    assert pool.settle(pool.flights[2])  # given up without waiting (a timeout, a hand-back)
    assert list(pool.stopping.values()) == [told]
    gate.set()
    deadline = time.monotonic() + 10
    while pool.stopping:
        assert time.monotonic() < deadline, "the told handler's return was never seen"
        assert pool.collect(0.05) == []  # its late result is still discarded
    pool.stop()


def test_a_run_claimed_again_replaces_its_earlier_flight_which_is_told_to_stop():
    # The tick stalled past the lease; another rescued the run; this one claims it anew.
    gate = threading.Event()
    pool = pool_of(spec(func=lambda ctx, payload: gate.wait(10)))
    pool.add([claimed(1)])
    wait_until_started(pool, 1)
    earlier = pool.flights[1]
    [displaced] = pool.add([claimed(1)])
    assert displaced is earlier and earlier.ctx.cancelled.is_set()
    again = pool.flights[1]
    assert again is not earlier
    gate.set()
    [result] = collect_all(pool, 1)  # the earlier result is dropped, the new flight stays
    deadline = time.monotonic() + 10
    while pool.stopping:  # whichever handler returned first
        assert time.monotonic() < deadline, "the earlier handler's return was never seen"
        assert pool.collect(0.05) == []
    assert result.flight is again and pool.flights == {}
    pool.stop()


def test_a_thread_whose_run_was_given_up_is_replaced_while_its_handler_runs_on():
    stuck = threading.Event()

    def handler(ctx: Any, payload: Any) -> None:
        if ctx.run_id == 1:
            stuck.wait(10)  # ignores ctx.cancelled

    pool = pool_of(spec(func=handler), concurrency=1)
    pool.add([claimed(1), claimed(2)])
    wait_until_started(pool, 1)
    assert pool.settle(pool.flights[1], await_return=True)
    [result] = collect_all(pool, 1)  # run 2 ran on a new thread meanwhile
    assert result.flight.run.id == 2
    stuck.set()
    pool.stop()


def test_a_handler_past_its_timeout_is_settled_and_another_thread_takes_its_place():
    stuck = threading.Event()
    done: list[int] = []

    def handler(ctx: Any, payload: Any) -> None:
        if ctx.run_id == 1:
            stuck.wait(10)
        done.append(ctx.run_id)

    pool = pool_of(spec(func=handler, timeout=0.05), concurrency=1)
    pool.add([claimed(1), claimed(2)])
    wait_until_started(pool, 1)
    started = pool.flights[1].started
    assert started is not None
    assert pool.overdue(started + 0.01) == []  # not yet
    [late] = pool.overdue(started + 0.06)
    assert late.run.id == 1 and late.state is FlightState.SETTLED and late.slot.retired
    [result] = collect_all(pool, 1)  # run 2 ran on the replacement while run 1 is stuck
    assert result.flight.run.id == 2 and done == [2]
    stuck.set()
    pool.stop()


def test_one_worker_runs_its_chunk_in_order_and_an_overrun_hands_the_rest_to_its_replacement():
    stuck = threading.Event()
    done: list[int] = []

    def handler(ctx: Any, payload: Any) -> None:
        if ctx.run_id == 2:
            stuck.wait(10)
        done.append(ctx.run_id)

    pool = pool_of(spec(func=handler, timeout=0.05), concurrency=1)
    pool.add([claimed(i) for i in range(1, 11)])  # one chunk: run 2 holds up runs 3 to 10
    wait_until_started(pool, 2)
    started = pool.flights[2].started
    assert started is not None
    [late] = pool.overdue(started + 0.06)
    assert late.run.id == 2
    results = collect_all(pool, 9)
    assert done == [1, *range(3, 11)]  # in claim order, run 2 still stuck in its handler
    assert sorted(r.flight.run.id for r in results) == [1, *range(3, 11)]
    stuck.set()
    pool.stop()


def test_several_workers_take_one_run_at_a_time_so_a_slow_one_holds_up_no_other():
    slow = threading.Event()

    def handler(ctx: Any, payload: Any) -> None:
        if ctx.run_id == 1:
            slow.wait(10)

    pool = pool_of(spec(func=handler), concurrency=2)
    pool.add([claimed(i) for i in range(1, 8)])
    results = collect_all(pool, 6)  # all but the slow one, on the other worker
    assert sorted(r.flight.run.id for r in results) == list(range(2, 8))
    slow.set()
    assert [r.flight.run.id for r in collect_all(pool, 1)] == [1]
    pool.stop()


def test_a_hand_back_reaches_the_runs_already_handed_to_a_worker_and_those_not_yet():
    gate = threading.Event()
    ran: list[int] = []
    pool = pool_of(
        spec(func=lambda ctx, payload: (gate.wait(10), ran.append(ctx.run_id))), concurrency=1
    )
    pool.add([claimed(i) for i in range(1, 501)])  # far more than is handed ahead
    wait_until_started(pool, 1)
    given_up = pool.settle_all({FlightState.QUEUED})
    assert sorted(f.run.id for f in given_up) == list(range(2, 501))
    gate.set()
    assert [r.flight.run.id for r in collect_all(pool, 1)] == [1]
    # The one worker takes runs in the order they were added: once a run added after the
    # hand-back has run, no run handed back can still start.
    pool.add([claimed(501)])
    assert [r.flight.run.id for r in collect_all(pool, 1)] == [501]
    assert ran == [1, 501]
    pool.stop()


# -- the batcher: pacing and the decision buffer --------------------------------


def batcher(concurrency: int = 4, batch_size: int = 500, now: float = 0.0) -> Batcher:
    handlers = {"t": spec()}
    return Batcher(
        handlers,
        leases={"t": 60.0},
        concurrency=concurrency,
        batch_size=batch_size,
        worker="test:1",
        clock=lambda: now,
    )


def test_before_any_handler_returned_a_claim_asks_for_twice_the_concurrency():
    p = batcher(concurrency=4)
    assert p.backlog(0.5) == 4
    assert p.claim(0, 0.5).keywords["limit"] == 8


def test_the_backlog_follows_how_fast_handlers_return_within_the_batch_size():
    p = batcher(concurrency=4, batch_size=50)
    for _ in range(30):
        p.returned()
    assert p.backlog(1.0) == 30 * CLAIM_HORIZON  # 30 returned in the first second
    for _ in range(500):
        p.returned()
    assert p.backlog(2.0) == 50  # never more than a batch


def test_no_claim_while_one_is_under_way_after_the_queue_ran_dry_or_when_stopping():
    p = batcher(concurrency=4)
    assert p.may_claim(0, 0.1)
    p.claim(0, 0.1)
    assert not p.may_claim(0, 0.1)  # under way
    p.claimed([claimed(1)])  # fewer than asked for: the queue ran dry
    assert p.exhausted and not p.may_claim(0, 0.1)
    p.look_again()
    assert p.may_claim(0, 0.1)
    p.closed = True
    assert not p.may_claim(0, 0.1)


def test_a_claim_waits_until_the_workers_have_room_for_half_a_backlog():
    p = batcher(concurrency=4)  # backlog 4: room needed 2
    assert not p.may_claim(7, 0.1)  # room 1
    assert p.may_claim(6, 0.1)  # room 2


def test_a_claim_carries_the_decisions_so_far_and_only_those_leave_the_buffer():
    p = batcher()
    first = transitions.succeeded(claimed(1))
    p.decided(first)
    claim = p.claim(0, 0.1)
    assert claim.keywords["decisions"] == [first]
    later = transitions.succeeded(claimed(2))
    p.decided(later)  # while the claim is under way
    assert p.claimed([claimed(3)] * 8) == [first]
    assert p.decisions == [later] and not p.exhausted


def test_a_failed_claim_leaves_its_decisions_for_the_next_write():
    p = batcher()
    decision = transitions.succeeded(claimed(1))
    p.decided(decision)
    p.claim(0, 0.1)
    p.claim_failed()
    assert p.decisions == [decision] and p.may_claim(0, 0.1)


def test_decisions_are_written_on_their_own_only_when_no_claim_will_carry_them():
    p = batcher(concurrency=1, batch_size=2)
    p.decided(transitions.succeeded(claimed(1)))
    assert not p.finalize_due(0, 0.1)  # not yet FLUSH_INTERVAL, fewer than a batch
    assert not p.finalize_due(0, 0.3)  # due, but a claim would carry them
    p.decided(transitions.succeeded(claimed(2)))
    assert p.finalize_due(3, 0.35)  # a full batch, and no room to claim
    decisions, write = p.finalize()
    assert write.keywords["decisions"] == decisions
    p.finalized(decisions)
    assert p.decisions == []


# -- the lease keeper ----------------------------------------------------------


class FakeConnection:
    """Stands in for the connection keeper: answers each statement with what it is given."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.statements: list[tuple[str, Any]] = []

    def run(self, what: str, op: Any, *, passing: tuple[type[Exception], ...] = ()) -> Any:
        self.statements.append((what, op))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.lines.append((level, event, fields))


def flight(run_id: int, job_type: str = "t") -> Flight:
    return Flight(claimed(run_id, job_type), spec(job_type), ctx=None)  # type: ignore[arg-type]


def test_leases_renew_every_third_of_the_shortest_lease():
    keeper = LeaseKeeper({"a": spec("a", lease=90.0), "b": spec("b", lease=30.0)}, clock=lambda: 0)
    assert keeper.every == 10.0
    assert not keeper.beat_due(9.9) and keeper.beat_due(10.0)


def test_a_beat_renews_every_lease_held_and_returns_the_runs_it_no_longer_holds():
    keeper = LeaseKeeper({"a": spec("a", lease=90.0), "b": spec("b", lease=30.0)}, clock=lambda: 0)
    flights = [flight(1, "a"), flight(2, "b"), flight(3, "a")]
    connection = FakeConnection({1: "until", 3: "until"})
    assert keeper.renew(connection, flights, now=10.0) == [flights[1]]  # type: ignore[arg-type]
    [(what, beat)] = connection.statements
    assert what == "heartbeat" and beat.keywords["leases"] == [90.0, 30.0, 90.0]
    assert not keeper.beat_due(19.9) and keeper.beat_due(20.0)


def test_a_tick_wide_lease_overrides_each_handlers_own():
    keeper = LeaseKeeper({"a": spec("a", lease=90.0)}, lease=45.0, clock=lambda: 0)
    connection = FakeConnection({1: "until"})
    keeper.renew(connection, [flight(1, "a")], now=0.0)  # type: ignore[arg-type]
    assert connection.statements[0][1].keywords["leases"] == [45.0]
    assert keeper.every == 15.0


def test_a_beat_that_finds_a_row_locked_is_skipped_and_loses_nothing():
    log = Log()
    keeper = LeaseKeeper({"a": spec("a")}, clock=lambda: 0, log=log)
    connection = FakeConnection(psycopg.errors.LockNotAvailable("lock timeout"))
    assert keeper.renew(connection, [flight(1, "a")], now=40.0) == []  # type: ignore[arg-type]
    assert [event for _, event, _ in log.lines] == ["heartbeat skipped: a run's row is locked"]
    assert not keeper.beat_due(40.0)


def test_a_beat_the_database_failed_is_due_again_at_once():
    keeper = LeaseKeeper({"a": spec("a", lease=30.0)}, clock=lambda: 0)
    connection = FakeConnection(StatementFailed("heartbeat"))
    with pytest.raises(StatementFailed):
        keeper.renew(connection, [flight(1, "a")], now=10.0)  # type: ignore[arg-type]
    assert keeper.beat_due(10.0)


# -- shutdown and the connection keeper ------------------------------------------


def test_the_first_stop_reason_stays_and_a_second_signal_ends_the_grace_period():
    shutdown = Shutdown(grace=25.0)
    shutdown.on_signal(15)
    shutdown.request("max-runtime")
    assert shutdown.reason == "SIGTERM" and not shutdown.grace_spent(shutdown.at + 1)
    assert shutdown.grace_spent(shutdown.at + 25)
    shutdown.on_signal(2)
    assert shutdown.urgent and shutdown.grace_spent(shutdown.at)


def test_the_connection_keeper_runs_one_statement_at_a_time():
    keeper = ConnectionKeeper(conn=object(), database=NoDatabase(), log=Log())
    woke = threading.Event()
    release = threading.Event()
    keeper.begin("claim", lambda conn: release.wait(10) and "claimed", then=woke.set)
    assert keeper.busy and not keeper.finished
    with pytest.raises(RuntimeError, match="result of the claim was not taken"):
        keeper.run("heartbeat", lambda conn: None)
    release.set()
    assert woke.wait(10) and keeper.finished
    assert keeper.result() == "claimed" and not keeper.busy
    assert keeper.run("heartbeat", lambda conn: "beat") == "beat"


def test_a_failed_statement_raises_and_says_which_step_failed():
    class Conn:
        broken = closed = False

    def fail(_conn: Any) -> None:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    log = Log()
    keeper = ConnectionKeeper(conn=Conn(), database=NoDatabase(), log=log)
    with pytest.raises(StatementFailed) as failed:
        keeper.run("finalize", fail)
    assert failed.value.what == "finalize" and isinstance(failed.value, JobrunnerError)
    assert log.lines[0][1] == "database error" and log.lines[0][2]["during"] == "finalize"


def test_a_statement_the_database_refuses_is_no_interruption_and_keeps_the_connection():
    class Conn:
        broken = closed = False

    def refuse(_conn: Any) -> None:
        raise psycopg.errors.InsufficientPrivilege("permission denied for table job_runs")

    conn, log = Conn(), Log()
    keeper = ConnectionKeeper(conn=conn, database=NoDatabase(), log=log)
    with pytest.raises(StatementFailed) as failed:
        keeper.run("claim", refuse)
    assert failed.value.failure is Failure.REFUSED and not failed.value.retryable
    assert failed.value.error.primary == "permission denied for table job_runs"
    assert keeper.conn is conn
    [(level, event, fields)] = log.lines
    assert (level, event) == ("warning", "database error")
    assert (fields["during"], fields["sqlstate"]) == ("claim", "42501")
