"""A row's place in the claim: its ``available_at``, moved earlier by its priority's credit.

The claim orders owed rows by ``claim_rank``: ``available_at`` in microseconds since the
epoch, minus the row's ``priority_credit``. The credit is written at fire from the
receiver's ``priority`` and is less than ``PRIORITY_AGING_SECONDS`` for any priority, so
a row goes before every row that comes due more than ``PRIORITY_AGING_SECONDS`` after it,
whatever their priorities: no due row starves. Both are stored columns, so one partial
index over owed rows on ``(claim_rank, id)`` serves the claim whatever the backlog, and
``claim_rank`` follows ``available_at`` wherever it is written (``models.DeliveryQuerySet``,
``claim.compare_and_set`` and the PostgreSQL statements).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from . import conf

_AWARE_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH = datetime(1970, 1, 1)  # USE_TZ = False: naive local time throughout
_MICROSECOND = timedelta(microseconds=1)


def credit(priority: int) -> int:
    """How many microseconds earlier than its due time a row of ``priority`` is ordered.

    ``PRIORITY_AGING_SECONDS x p / (|p| + 1)``: 0 for 0, half the aging for 1, nine
    tenths for 9; always less than the aging in either direction, and higher for a
    higher priority.
    """
    aging = conf.get().PRIORITY_AGING_SECONDS
    return round(aging * 1_000_000 * priority / (abs(priority) + 1))


def rank(moment: datetime) -> int:
    """``moment`` in microseconds since the epoch: the rank of a row of priority 0 owed
    from then (a row's rank is this minus its credit)."""
    epoch = _NAIVE_EPOCH if moment.tzinfo is None else _AWARE_EPOCH
    return (moment - epoch) // _MICROSECOND


def window(now: datetime) -> int:
    """The highest rank a row due at ``now`` can have: the claim's range on the index,
    so a claim reads past due rows only into the next ``PRIORITY_AGING_SECONDS``."""
    return rank(now) + credit_bound()


def credit_bound() -> int:
    """The largest credit's magnitude, in microseconds: the aging itself."""
    return round(conf.get().PRIORITY_AGING_SECONDS * 1_000_000)
