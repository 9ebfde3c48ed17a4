"""Backoff: exponential with full jitter, capped; and how outcomes become decisions."""

from __future__ import annotations

import random
import uuid

import pytest

from cronjob.handlers import Backoff
from cronjob.models import ClaimedRun, Errored, Status, Succeeded
from cronjob.transitions import backoff_delay, decide


def claimed(attempt: int, *, final_attempt: bool = False) -> ClaimedRun:
    return ClaimedRun(1, "t", {}, None, None, attempt, final_attempt, uuid.uuid4())


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 8, 20, 100])
def test_backoff_stays_within_zero_and_the_capped_exponential(attempt):
    backoff = Backoff(base=15, cap=3600)
    ceiling = min(3600, 15 * 2 ** (attempt - 1))
    rng = random.Random(attempt)
    delays = [backoff_delay(attempt, backoff, rng) for _ in range(2000)]
    assert all(0 <= d <= ceiling for d in delays)
    # Full jitter spreads over the whole range, not just near the ceiling.
    assert min(delays) < ceiling * 0.05 and max(delays) > ceiling * 0.95


def test_backoff_defaults_are_15s_base_and_1h_cap():
    assert Backoff() == Backoff(base=15, cap=3600)
    assert Backoff.of(("30s", "2h")) == Backoff(base=30, cap=7200)
    assert Backoff.of("1m") == Backoff(base=60, cap=3600)


def test_an_error_with_attempts_left_has_failed_and_retries_after_a_backoff():
    decision = decide(claimed(2), Errored("E", "m"), Backoff(base=10, cap=100))
    assert decision.status is Status.FAILED
    assert 0 <= decision.retry_delay <= 20


def test_an_error_on_the_final_attempt_is_dead():
    decision = decide(claimed(5, final_attempt=True), Errored("E", "m"), Backoff())
    assert decision.status is Status.DEAD


def test_a_retry_asked_on_the_final_attempt_is_dead():
    errored = Errored("Retry", "later", retry_delay=1.0)
    assert decide(claimed(5, final_attempt=True), errored, Backoff()).status is Status.DEAD


def test_retry_delay_asked_by_the_handler_is_used():
    decision = decide(claimed(1), Errored("Retry", "later", retry_delay=42.0), Backoff())
    assert (decision.status, decision.retry_delay) == (Status.FAILED, 42.0)


def test_fail_is_dead_at_once():
    decision = decide(claimed(1), Errored("Fail", "no", permanent=True), Backoff())
    assert decision.status is Status.DEAD


def test_success_is_succeeded():
    assert decide(claimed(1), Succeeded(), Backoff()).status is Status.SUCCEEDED


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90s", 90),
        ("5m", 300),
        ("2h", 7200),
        ("1d", 86400),
        ("250ms", 0.25),
        ("1.5h", 5400),
        (" 5 m ", 300),
        ("10", 10),
        ("0", 0),
        (42, 42),
    ],
)
def test_durations_are_parsed(text, seconds):
    from cronjob.inputs import parse_duration

    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", "s", "5 parsecs", "-5m", "1.", ".5", "5x", "1e3", "5mm", "²", "nan", "inf", "1..5s"],
)
def test_malformed_durations_are_bad_input(text):
    from cronjob.errors import BadInput
    from cronjob.inputs import parse_duration

    with pytest.raises(BadInput, match="invalid duration"):
        parse_duration(text)
