"""Group acknowledgement: a run of ``ack="batch"`` rows delivered in one commit.

For receivers whose only effects are writes to this database, a commit per delivery is
most of the cost. Here a run of such rows from one claim shares one transaction: each
receiver runs in a savepoint, a failing one rolls back only its own savepoint and is
recorded failed in the same commit, and the successes are acknowledged by one
statement. The heartbeat keeps every row of the group alive until the commit, so a
group longer than a lease loses none of its rows to another relay. A crash, or a row
of the group lost to another worker, repeats the whole group (the second case one row
at a time), which is safe only because every effect was in the rolled-back
transaction.

Savepoints cost two round trips a row, so a group first runs without them; only when a
receiver raises is the group rolled back and run again with one savepoint per row.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connections, transaction

from .. import tracing
from ..models import DeliveryStatus, database_alias
from ..scope import caused_by
from .claim_rows import Claim
from .lease import kept_alive_together
from .outage import Blame, blame
from .outcomes import Outcome
from .report import Timing, report_success
from .run import (
    Attempted,
    Ready,
    acknowledge_all,
    around_delivery,
    attempt,
    call_receiver,
    prepare_all,
    tell_failure,
    write_failure,
)

logger = logging.getLogger("django_domain_events.delivery")


class _GroupLost(Exception):
    """A row of the group was taken over, or a receiver broke the transaction beyond its
    savepoint: roll the whole group back and run its rows one at a time."""


class _Failed(Exception):
    """A receiver raised in a group run without savepoints: run it again with them."""


def attempt_group(
    claims: Sequence[Claim], *, now: datetime, decoded: dict[int, Any] | None = None
) -> list[Attempted]:
    """Run ``claims`` (of one claim, all ``ack="batch"``) in one transaction; the result
    of each, in order, as ``attempt()`` gives it."""
    alias = database_alias()
    ready, results = prepare_all(alias, claims, now, decoded)
    try:
        try:
            results.update(_run_together(alias, ready, now, savepoints=False))
        except _Failed:
            results.update(_run_together(alias, ready, now, savepoints=True))
    except _GroupLost:
        logger.info(
            "A row of a group of %s was taken over by another worker, or its receiver broke "
            "the transaction; the group was rolled back and its rows run one at a time.",
            len(ready),
        )
        for row in ready:
            results[row.claim.id] = attempt(row.claim, now=now)
    return [results[claim.id] for claim in claims]


def _run_together(
    alias: str, ready: Sequence[Ready], now: datetime, *, savepoints: bool
) -> dict[int, Attempted]:
    succeeded: list[tuple[Claim, Timing]] = []
    failed: list[tuple[Ready, Outcome, BaseException, Timing]] = []
    kept = [(row.claim, row.lease) for row in ready]
    with kept_alive_together(alias, kept) as let_go, transaction.atomic(using=alias):
        for row in ready:
            hook = around_delivery(row.ctx)  # an unimportable hook escapes, charging nothing
            timing = Timing.start()
            try:
                with (
                    transaction.atomic(using=alias, savepoint=savepoints),
                    tracing.attempt_span(row.ctx),
                    hook,
                    caused_by(row.claim.event_id, row.claim.correlation_id),
                ):
                    call_receiver(row.receiver, row.evt, row.ctx)
            except BaseException as error:  # whatever the receiver raised
                if blame(error, alias) is Blame.OUTBOX:
                    raise
                if not savepoints:
                    raise _Failed from error
                if connections[alias].needs_rollback:  # its savepoint could not roll back
                    raise _GroupLost from error  # (a receiver broke the connection): alone
                outcome, written = write_failure(row.claim, row.receiver, error, now=now)
                if not written:
                    raise _GroupLost from None
                let_go(row.claim.id)  # written in this transaction: its row is locked
                failed.append((row, outcome, error, timing.stop()))
                continue
            succeeded.append((row.claim, timing.stop()))
        if succeeded and not acknowledge_all(alias, [claim for claim, _ in succeeded]):
            raise _GroupLost
    for claim, timing in succeeded:  # reported only once the commit made them true
        report_success(claim, timing)
    for row, outcome, raised, timing in failed:
        tell_failure(row.claim, row.receiver, outcome, raised, timing)
    results: dict[int, Attempted] = {c.id: (DeliveryStatus.SUCCEEDED, None) for c, _ in succeeded}
    results.update({row.claim.id: (outcome.status, outcome) for row, outcome, *_ in failed})
    return results
