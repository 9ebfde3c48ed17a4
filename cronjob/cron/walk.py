"""When an expression fires in real time: its matching wall-clock times, walked, and the
daylight-saving policy that turns each into instants.

Matching wall-clock times are found by walking the sets of `fields.Expanded`: the minutes
croniter's own iterator finds for the same expression, at a small fraction of its cost per
step. The walk applies cron's day-field rule (croniter's differs for stepped stars such as
``*/2``) and the daylight-saving policy of the package docstring, which croniter does not have.
croniter walks (`fields.croniter_walls`) only near the ends of the calendar, where its search
horizon decides when a stream stops.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from cronjob.cron.fields import Cron, croniter_walls

_MINUTE = timedelta(minutes=1)
_RESOLUTION = timedelta(microseconds=1)
# Instants are computed as an epoch plus elapsed time: datetime.replace() parses its nine
# keywords by name on every call, several times the cost of the arithmetic, and the walk
# converts every wall time it passes.
_WALL_EPOCH = datetime(1970, 1, 1)
_UTC_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Offsets looked at around a boundary to find where wall-clock iteration must start. A wall time
# earlier than `after`'s own reading still fires after it when `after` sits in the first half
# of a repeated period; probing a few hours (and a day, for historic date-line moves) ahead
# finds the smaller offset in force there.
_OFFSET_PROBES = (timedelta(0), timedelta(hours=3), timedelta(hours=25))


def walls(cron: Cron, start: datetime, forward: bool) -> Iterator[datetime]:
    """Matching wall-clock times strictly after (or before) the naive wall time `start`.

    Wall times are naive on purpose: finding them is plain calendar arithmetic, and all
    daylight-saving decisions are made in `_resolve`, where they can follow Vixie cron.
    """
    step = cron.expanded.next_wall if forward else cron.expanded.previous_wall
    wall = start
    while (found := step(wall)) is not None:
        yield found
        wall = found
    yield from croniter_walls(cron, wall, forward)


def _offset_at(instant: datetime, zone: ZoneInfo) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    assert offset is not None
    return offset


def _transition(zone: ZoneInfo, before: datetime, after: datetime) -> datetime:
    """The instant in (before, after] at which `zone` leaves the offset it has at `before`."""
    old = _offset_at(before, zone)
    low, high = int(before.timestamp()), int(after.timestamp())
    # tzdata transitions fall on whole seconds, so bisecting whole seconds finds it exactly.
    while high - low > 1:
        middle = (low + high) // 2
        if _offset_at(datetime.fromtimestamp(middle, UTC), zone) == old:
            low = middle
        else:
            high = middle
    return datetime.fromtimestamp(high, UTC)


def _resolve(
    wall: datetime, zone: ZoneInfo, wildcard: bool
) -> tuple[tuple[datetime, ...], datetime, datetime]:
    """What one matching wall-clock time means in real time: (instants, earliest, latest).

    `instants` are the fire times it contributes (none, one, or two in a repeated period).
    `earliest` and `latest` bound every instant this wall time or any later (respectively,
    earlier) wall time can contribute; they let the merge in `_fire_times` release pending
    instants as soon as nothing can come before (after) them any more.
    """
    # The zone reads a naive wall time's fields and `fold` just as it would an aware one's.
    # Walls are whole minutes with fold 0; the second reading is built rather than replaced.
    second_reading = datetime(wall.year, wall.month, wall.day, wall.hour, wall.minute, fold=1)
    first_offset, second_offset = zone.utcoffset(wall), zone.utcoffset(second_reading)
    assert first_offset is not None and second_offset is not None
    earlier = _UTC_EPOCH + (wall - _WALL_EPOCH - first_offset)
    if first_offset == second_offset:
        return (earlier,), earlier, earlier
    later = _UTC_EPOCH + (wall - _WALL_EPOCH - second_offset)
    if first_offset > second_offset:
        # Repeated period: fold=0 is the first reading, in the offset before the clocks went
        # back; fold=1 the second one, an offset-change later.
        instants = (earlier, later) if wildcard else (earlier,)
        return instants, earlier, later
    # Skipped period: fold=0 applies the old offset and lands after the jump, fold=1 the new
    # offset and lands before it, so the jump lies between them.
    jump = _transition(zone, later, earlier)
    instants = () if wildcard else (jump,)
    return instants, jump, jump


def _wall_minute(instant: datetime, offset: timedelta) -> datetime:
    """The naive wall-clock minute a UTC `instant` reads as in `offset`."""
    reading = instant + offset
    return datetime(reading.year, reading.month, reading.day, reading.hour, reading.minute)


def _fire_times(
    cron: Cron, zone: ZoneInfo, start: datetime, forward: bool, beyond: datetime
) -> Iterator[datetime]:
    """Distinct fire instants walking from wall time `start`, beyond the instant `beyond`.

    Forward they ascend and are later than `beyond`; backward they descend and are earlier.
    Wall times arrive in order, but in a repeated period the second readings of earlier wall
    times interleave with the first readings of later ones. Instants therefore wait in
    `pending` until the bound of the current wall time proves nothing can still precede them.
    """
    pending: list[datetime] = []
    # The last instant emitted: several gap times collapse into the same jump instant, and
    # each is emitted once. Starting from `beyond` also drops everything up to it.
    last = beyond
    for wall in walls(cron, start, forward):
        instants, earliest, latest = _resolve(wall, zone, cron.wildcard)
        for instant in instants:
            insort(pending, instant)
        while pending and (pending[0] <= earliest if forward else pending[-1] >= latest):
            instant = pending.pop(0) if forward else pending.pop()
            if instant > last if forward else instant < last:
                last = instant
                yield instant
    for instant in pending if forward else reversed(pending):
        if instant > last if forward else instant < last:
            last = instant
            yield instant


def forward_from(cron: Cron, zone: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """Fire instants strictly after `after`, ascending."""
    # Wall times above `after`'s own reading are the obvious candidates, but in a repeated
    # period a lower wall time can still have its second reading ahead. Reading `after` in the
    # smallest offset in force over the next day starts early enough for both; the extra walk
    # only happens shortly before a fall-back.
    offset = min((after + probe).astimezone(zone).utcoffset() for probe in _OFFSET_PROBES)
    return _fire_times(cron, zone, _wall_minute(after, offset), True, after)


def backward_from(cron: Cron, zone: ZoneInfo, until: datetime) -> Iterator[datetime]:
    """Fire instants at or before `until`, descending."""
    # Mirror image of `forward_from`: just after a fall-back, a wall time above `until`'s
    # reading may have had its first reading already.
    offset = max((until - probe).astimezone(zone).utcoffset() for probe in _OFFSET_PROBES)
    start = _wall_minute(until, offset) + _MINUTE
    # Earlier than the next representable instant means at or before `until`.
    return _fire_times(cron, zone, start, False, until + _RESOLUTION)
