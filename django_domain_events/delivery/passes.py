"""Passes over the owed rows: ``deliver_one``, ``deliver_pending`` and one relay pass.

A pass visits each lane in sorted order, claims one batch there just before running
it, and runs the batch row by row (``run.attempt``), handing back the unstarted rest on
a pause or a stop, and every row not yet settled when something escapes.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .. import clock, conf
from ..declare import registry
from ..models import DeliveryStatus, LanePauseRecord, database_alias
from .claim import claim_batch, release, take_over
from .claim_rows import Claim
from .group import attempt_group
from .lease import lane_lease
from .locked import LockedBatch, LockedClaims, lockable_keys
from .outcomes import Outcome
from .run import attempt, record_failure, settle_if_ended
from .run import logger as delivery_logger
from .tasks import hand_off

Counts = dict[DeliveryStatus, int]

# What running one claim answers: its status and outcome, or None when it was handed to
# the task queue.
Result = tuple[DeliveryStatus | None, Outcome | None] | None


def default_worker_id() -> str:
    """``host:pid``, unique among the processes of a deployment."""
    return f"{socket.gethostname()}:{os.getpid()}"


def empty_counts() -> Counts:
    return {status: 0 for status in DeliveryStatus}


def _parse_claimed_at(value: datetime | str) -> datetime:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"claimed_at must be the ISO 8601 string the relay enqueued, not {value!r}."
        ) from None


def deliver_one(
    delivery_id: int,
    *,
    worker_id: str | None = None,
    claimed_by: str | None = None,
    claimed_at: datetime | str | None = None,
) -> DeliveryStatus | None:
    """Run one owed row now; None for a row that is not owed or not yet due, or that a
    broker outage handed back uncharged (a publish, ``contrib.brokers``).

    With ``claimed_by`` and ``claimed_at`` (a task worker), the row is first taken under
    exactly that claim; a duplicate or stale message runs nothing. Returns ``PENDING``
    when the receiver answered ``NotYet``.
    """
    if (claimed_by is None) != (claimed_at is None):
        raise TypeError("deliver_one() takes claimed_by and claimed_at together, or neither.")
    worker = worker_id or default_worker_id()
    clock.keep_synchronised(database_alias())  # the lease it stamps is by the database's clock
    now = clock.now()
    if claimed_by is not None and claimed_at is not None:
        claim = take_over(
            delivery_id,
            claimed_by=claimed_by,
            claimed_at=_parse_claimed_at(claimed_at),
            worker_id=worker,
            now=now,
            lease=lane_lease(None),
        )
        if claim is None:
            delivery_logger.info(
                "Delivery %s: the claim %s at %s no longer holds the row (a duplicate, late "
                "or stale message); nothing run.",
                delivery_id,
                claimed_by,
                claimed_at,
            )
            return None
    else:
        claims = claim_batch(
            worker_id=worker, now=now, lease=lane_lease(None), limit=1, ids=[delivery_id]
        )
        if not claims:
            return None
        claim = claims[0]
    if _batch_delivered([claim], 0):  # a publish: a broker outage hands it back, uncharged
        result = run_one(claim, now)
        return result[0] if result is not None else None
    status, _ = attempt(claim, now=now)
    return status


@dataclass
class Pass:
    """What one call of ``deliver_pending``, or one relay, keeps between batches.

    A lane set aside by ``RetryAfter(counts=False)`` stays aside for the rest of a
    ``deliver_pending`` call; a relay pauses it for the time asked, recorded in
    ``LanePauseRecord`` for operators.
    """

    worker_id: str
    now: datetime | None
    ignore_backoff: bool
    relay: bool = False
    counts: Counts = field(default_factory=empty_counts)
    excluded: set[int] = field(default_factory=set)
    paused_until: dict[str, float] = field(default_factory=dict)  # lane -> monotonic
    stop: Callable[[], bool] = lambda: False
    claimed: int = 0
    in_hand: list[Claim] = field(default_factory=list)  # the batch being run
    locked: LockedClaims = field(default_factory=LockedClaims)  # batches held by row locks

    def note(self, claim: Claim, status: DeliveryStatus | None, outcome: Outcome | None) -> float:
        """Count what one attempt recorded; returns the seconds its lane should pause."""
        if status is not None:
            self.counts[status] += 1
        if status is DeliveryStatus.PENDING and self.now is not None:
            self.excluded.add(claim.id)
        if status is DeliveryStatus.FAILED and self.ignore_backoff and claim.max_attempts is None:
            # Unbounded attempts end by lifetime, not count: once per call, or it would spin.
            self.excluded.add(claim.id)
        elif status is DeliveryStatus.FAILED and not self.relay and not self.ignore_backoff:
            # Its backoff begins now and ends in a later call, however short it is: a
            # jittered first backoff can be over at once, and the call would run it again.
            self.excluded.add(claim.id)
        return outcome.pause_seconds if outcome is not None else 0.0

    def pause(self, lane: str, seconds: float) -> None:
        self.paused_until[lane] = time.monotonic() + seconds
        if self.relay:
            record_pause(lane, self.worker_id, seconds)

    def may_go_on(self, lane: str) -> bool:
        """Whether the pass may take or send ``lane``'s next batch: it is neither
        stopping nor paused there."""
        return not self.stop() and not self.lane_paused(lane)

    def lane_paused(self, lane: str) -> bool:
        until = self.paused_until.get(lane)
        if until is None:
            return False
        if self.relay and time.monotonic() >= until:
            del self.paused_until[lane]
            end_pause(lane, self.worker_id)
            return False
        return True


def record_pause(lane: str, worker_id: str, seconds: float) -> None:
    """Show the pause to operators; clears pauses whose relay never came back to end them."""
    now = clock.now()
    alias = database_alias()
    pauses = LanePauseRecord.objects.using(alias)
    pauses.filter(until__lt=now).delete()
    pauses.update_or_create(
        lane=lane,
        worker_id=worker_id,
        defaults={"paused_at": now, "until": now + timedelta(seconds=seconds)},
    )


def end_pause(lane: str, worker_id: str) -> None:
    LanePauseRecord.objects.using(database_alias()).filter(lane=lane, worker_id=worker_id).delete()


def batch_size_of(lane: str, batch_size: int | None, lane_batch_sizes: Mapping[str, int]) -> int:
    return lane_batch_sizes.get(lane) or batch_size or conf.get().BATCH_SIZE


def check_sizes(batch_size: int | None, lane_batch_sizes: Mapping[str, int] | None) -> None:
    """Refuse a batch size that is not a whole number from 1 to ``conf.MAX_BATCH_SIZE``."""
    sizes = [("the batch size", batch_size)]
    sizes += [
        (f"the batch size of lane {lane!r}", size)
        for lane, size in (lane_batch_sizes or {}).items()
    ]
    for what, size in sizes:
        problem = None if size is None else conf.count_problem(what, size, conf.MAX_BATCH_SIZE)
        if problem is not None:
            raise ValueError(problem)


def deliver_pending(
    limit: int | None = None,
    *,
    worker_id: str = "deliver_pending",
    ignore_backoff: bool = False,
    lane: str | None = None,
    batch_size: int | None = None,
    lane_batch_sizes: Mapping[str, int] | None = None,
    now: datetime | None = None,
) -> Counts:
    """Claim and deliver until nothing is claimable (or ``limit`` rows), every lane in turn.

    ``now`` is the moment every claim of the call is made at; receivers still run on the
    real clock. Returns the count of each outcome recorded; a task hand-off is not counted.
    """
    check_sizes(batch_size, lane_batch_sizes)
    if limit is not None and limit < 0:
        raise ValueError(f"deliver_pending(limit=) must be >= 0 or None, not {limit!r}.")
    state = Pass(worker_id, clock.normalize(now) if now is not None else None, ignore_backoff)
    lanes = [lane] if lane is not None else list(registry.lanes())
    try:
        while limit is None or state.claimed < limit:
            before = state.claimed
            for name in lanes:
                room = None if limit is None else limit - state.claimed
                if room == 0:
                    break
                run_lane_batch(
                    state, name, batch_size_of(name, batch_size, lane_batch_sizes or {}), room
                )
            if state.claimed == before:
                break
    finally:
        state.locked.close()
    return state.counts


# A lane's full batch that ends in a broker publish claims the lane's next batch while
# the publish's confirms are outstanding, and runs it next: batches follow one another
# so for at most this long, one turn of the lane, before the other lanes get theirs.
# Ending a turn empties the pipeline (the next turn's first batch is sent with nothing
# claimed ahead of it): a turn of eight 500-row batches lost a tenth of a relay's
# publishing, and another lane waits at most about this long.
TURN_SECONDS = 1.0


def _turn_ends(began: float) -> bool:
    """Whether a lane's turn that began at ``began`` (monotonic) has had its time."""
    return time.monotonic() - began >= TURN_SECONDS


def run_lane_batch(state: Pass, lane: str, size: int, room: int | None = None) -> int:
    """Claim one batch in ``lane`` and run it; returns how many rows were claimed.

    The rows of receivers that settle by row lock (``locked.py``) are claimed apart,
    first; a publish overlaps the next claim with its confirms (see ``TURN_SECONDS``).
    """
    if state.lane_paused(lane):
        return 0
    locked = lockable_keys(lane)
    claimed = _run_locked(state, lane, locked, size, room) if locked else 0
    left = None if room is None else room - claimed
    if left == 0 or not state.may_go_on(lane):
        return claimed
    return claimed + _run_claimed(state, lane, size, left, skip=locked)


def _run_claimed(state: Pass, lane: str, size: int, room: int | None, skip: tuple[str, ...]) -> int:
    """The lane's rows claimed the usual way (all but ``skip``'s), a batch at a time."""
    began = time.monotonic()
    claims, now = _claim_lane(state, lane, size, room, skip)
    claimed = 0
    while True:
        claimed += len(claims)
        left = None if room is None else room - claimed
        more = len(claims) == size and not _turn_ends(began) and left != 0
        ahead = _Ahead(state, lane, size, left, skip) if more else None
        state.in_hand = list(claims)  # kept if the batch fails, for the relay to hand back
        run_batch(state, lane, claims, now, ahead)
        state.in_hand = []
        if ahead is None or not ahead.claims:
            break
        claims, now = ahead.claims, ahead.now
        if not state.may_go_on(lane):
            release(claims)
            break
    return claimed


def _claim_lane(
    state: Pass, lane: str, size: int, room: int | None, skip: tuple[str, ...] = ()
) -> tuple[list[Claim], datetime]:
    now = state.now if state.now is not None else clock.now()
    claims = claim_batch(
        worker_id=state.worker_id,
        now=now,
        lease=lane_lease(lane),
        limit=size if room is None else min(size, room),
        lane=lane,
        exclude_ids=state.excluded,
        ignore_backoff=state.ignore_backoff,
        skip_keys=skip,
    )
    state.claimed += len(claims)
    return claims, now


def _run_locked(state: Pass, lane: str, keys: tuple[str, ...], size: int, room: int | None) -> int:
    """Batches of ``keys``' rows claimed by row lock (``locked.py``), one after another
    for at most ``TURN_SECONDS``; returns how many rows were claimed.

    While one batch's confirms are outstanding the next is locked on the other
    connection and its messages built; once every row of the batch arrived, the next is
    sent before this one's acknowledgement is committed, so the commit waits on the
    database while the broker takes the next. A batch with a row not confirmed is
    settled before anything more is sent (its retries may then reorder a key's
    messages, as any retry does)."""
    claimed, began = 0, time.monotonic()
    try:
        batch = _lock_lane(state, lane, keys, size, room, turn=0)
        if not batch.claims:
            batch.give_back()
            return 0
        waiting = batch.send()
        for turn in itertools.count(1):
            claimed += len(batch.claims)
            left = None if room is None else room - claimed
            more = len(batch.claims) == size and not _turn_ends(began) and left != 0
            ahead = _lock_lane(state, lane, keys, size, left, turn) if more else None
            if ahead is not None and not ahead.claims:
                ahead.give_back()
                ahead = None
            elif ahead is not None:
                ahead.prepare()  # its messages built while this batch is on its way
            outcomes = waiting()
            arrived = all(outcome is None for outcome in outcomes.values())
            sent_ahead = False
            if ahead is not None and arrived and state.may_go_on(lane):
                waiting, sent_ahead = ahead.send(), True
            results = batch.settle(outcomes, state.in_hand)
            state.in_hand = []
            paused = _note_results(state, lane, batch.claims, results)
            if ahead is None:
                break
            if not sent_ahead:
                if paused or not state.may_go_on(lane):
                    ahead.give_back()
                    break
                waiting = ahead.send()
            batch = ahead
    except BaseException:
        state.locked.give_back()  # whatever was locked is owed again, uncharged
        raise
    return claimed


def _lock_lane(
    state: Pass, lane: str, keys: tuple[str, ...], size: int, room: int | None, turn: int
) -> LockedBatch:
    now = state.now if state.now is not None else clock.now()
    batch = state.locked.take(
        turn,
        worker_id=state.worker_id,
        keys=keys,
        now=now,
        lease=lane_lease(lane),
        limit=size if room is None else min(size, room),
        exclude=state.excluded,
        ignore_backoff=state.ignore_backoff,
    )
    state.claimed += len(batch.claims)
    return batch


class _Ahead:
    """The lane's next batch, claimed (when called) while a publish's confirms are
    outstanding; sent only once this batch is settled, so one relay keeps event order."""

    def __init__(
        self, state: Pass, lane: str, size: int, room: int | None, skip: tuple[str, ...]
    ) -> None:
        self.state, self.lane, self.size, self.room = state, lane, size, room
        self.skip = skip
        self.claims: list[Claim] = []
        self.now: datetime = clock.now()

    def __call__(self) -> None:
        self.claims, self.now = _claim_lane(self.state, self.lane, self.size, self.room, self.skip)
        self.state.in_hand.extend(self.claims)  # handed back with the batch if it fails


def run_batch(
    state: Pass, lane: str, claims: Sequence[Claim], now: datetime, ahead: _Ahead | None = None
) -> None:
    """Run a claimed batch in order; hand back the unstarted rest on a pause or a stop,
    and every row not yet settled when something escapes (nothing is charged for it)."""
    try:
        _run_claims(state, lane, claims, now, ahead)
    except BaseException:
        with contextlib.suppress(Exception):  # in an outage the relay hands back later
            release([*claims, *(ahead.claims if ahead is not None else ())])  # compare-and-set
        raise


def _run_claims(
    state: Pass, lane: str, claims: Sequence[Claim], now: datetime, ahead: _Ahead | None
) -> None:
    decoded: dict[int, Any] = {}
    index = 0
    while index < len(claims):
        if state.stop():
            release(claims[index:])
            return
        group = _batch_acked(claims, index)
        batched = _batch_delivered(claims, index)
        if len(group) > 1:
            results: list[Result] = list(attempt_group(group, now=now, decoded=decoded))
        elif batched:  # e.g. contrib.brokers: one publish with confirms for the run
            group = batched
            func: Any = registry.receiver(group[0].receiver_key).func  # type: ignore[union-attr]
            last = index + len(group) == len(claims)
            extra = {"meanwhile": ahead} if ahead is not None and last else {}
            results = list(func.deliver_batch(group, now=now, **extra))
        else:
            group = [claims[index]]
            results = [run_one(claims[index], now, decoded)]
        index += len(group)
        if _note_results(state, lane, group, results):
            release(claims[index:])
            return


def _note_results(
    state: Pass, lane: str, claims: Sequence[Claim], results: Sequence[Result]
) -> bool:
    """Count the results of ``claims``; True when the lane was paused for them."""
    pause = 0.0
    for claim, result in zip(claims, results, strict=True):
        if result is None:  # handed to the task queue, or back (a broker outage)
            if state.now is not None or state.ignore_backoff:
                state.excluded.add(claim.id)
            continue
        pause = max(pause, state.note(claim, *result))
    if pause:
        state.pause(lane, pause)
    return bool(pause)


def _batch_acked(claims: Sequence[Claim], start: int) -> list[Claim]:
    """The run of ``ack="batch"`` relay rows from ``start`` on (empty when there is none)."""
    group = []
    for claim in claims[start:]:
        receiver = registry.receiver(claim.receiver_key)
        if receiver is None or receiver.ack != "batch" or receiver.site != "relay":
            break
        group.append(claim)
    return group


def _batch_delivered(claims: Sequence[Claim], start: int) -> list[Claim]:
    """The run of rows from ``start`` whose receivers deliver many rows at once: their
    function has ``deliver_batch(claims, now=)`` and the same ``batch_group`` (empty when
    there is none). A broker publish is one (``contrib.brokers``)."""
    group: list[Claim] = []
    first: object = None
    for claim in claims[start:]:
        receiver = registry.receiver(claim.receiver_key)
        func = receiver.func if receiver is not None and receiver.durable else None
        group_key = getattr(func, "batch_group", None)
        if group_key is None or not callable(getattr(func, "deliver_batch", None)):
            break
        if group and group_key != first:
            break
        first = group_key
        group.append(claim)
    return group


def run_one(claim: Claim, now: datetime, decoded: dict[int, Any] | None = None) -> Result:
    """Run one claimed row, or hand it to the task queue (None)."""
    receiver = registry.receiver(claim.receiver_key)
    if _batch_delivered([claim], 0):  # a batch of one (a relay's concurrent workers)
        func: Any = receiver.func  # type: ignore[union-attr]
        return func.deliver_batch([claim], now=now)[0]
    if receiver is None or not receiver.durable or receiver.site != "task":
        return attempt(claim, now=now, decoded=decoded)
    ended = settle_if_ended(database_alias(), claim, receiver, now)
    if ended is not None:  # its lapses spent its attempts: no more messages
        return ended
    try:
        hand_off(claim)
    except ImproperlyConfigured:
        raise  # no backend, or one that cannot be built: no row pays for it
    except Exception as error:  # the queue refused: a failed attempt
        return record_failure(claim, receiver, error, now=now)
    return None


def run_pass(
    state: Pass,
    lanes: Sequence[str],
    batch_size: int | None,
    lane_batch_sizes: Mapping[str, int],
    limit: int | None,
) -> int:
    """One batch per lane, each run in turn; returns the rows claimed."""
    claimed = 0
    for name in lanes:
        if state.stop():
            break
        room = None if limit is None else limit - state.claimed
        if room == 0:
            break
        size = batch_size_of(name, batch_size, lane_batch_sizes)
        claimed += run_lane_batch(state, name, size, room)
    return claimed
