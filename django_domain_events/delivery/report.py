"""What a delivery tells the world: its log records and its signals.

Every record and signal about a delivery names it by the same fields (``Subject``), so a
log handler, an alert or a metrics integration matches on them instead of parsing the
message, whether the row ran (``report_success``, ``report_failure``) or was settled
without running (``report_unrun``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .. import clock, signals
from ..declare import registry
from ..models import DeliveryRecord, DeliveryStatus
from .claim_rows import Claim
from .outcomes import DeliveryFailure

logger = logging.getLogger("django_domain_events.delivery")


@dataclass(frozen=True)
class Timing:
    """When an attempt started and how long its receiver ran: for metrics and traces."""

    started_at: datetime
    started: float  # monotonic
    seconds: float | None = None

    @classmethod
    def start(cls) -> Timing:
        return cls(clock.now(), time.monotonic())

    def stop(self) -> Timing:
        return Timing(self.started_at, self.started, time.monotonic() - self.started)

    def signal_arguments(self, claim: Claim) -> dict[str, float | None]:
        """``duration`` (seconds the receiver ran) and ``lag`` (seconds from the row's due
        time to the attempt's start)."""
        lag = max(0.0, (self.started_at - claim.due_at).total_seconds())
        return {"duration": self.seconds, "lag": lag}


@dataclass(frozen=True)
class Subject:
    """The delivery a log record, a signal or an ``on_failure`` call is about."""

    delivery_id: int
    event_id: int
    event_name: str
    receiver_key: str
    target: str
    attempt: int
    worker_id: str = ""

    @classmethod
    def of_claim(cls, claim: Claim, *, attempt: int | None = None) -> Subject:
        """The claimed row; ``attempt`` defaults to the one being made."""
        return cls(
            delivery_id=claim.id,
            event_id=claim.event_id,
            event_name=claim.event_name,
            receiver_key=claim.receiver_key,
            target=claim.target,
            attempt=claim.attempts + 1 if attempt is None else attempt,
            worker_id=claim.claimed_by,
        )

    @classmethod
    def of_row(cls, row: DeliveryRecord) -> Subject:
        """An unclaimed row (with its event selected), at the attempts it made."""
        return cls(
            delivery_id=row.pk,
            event_id=row.event_id,
            event_name=row.event.name,
            receiver_key=row.receiver_key,
            target=row.target,
            attempt=row.attempts,
        )

    def log_fields(self, status: DeliveryStatus | None = None) -> dict[str, Any]:
        """The ``extra=`` fields of every record logged about a delivery."""
        receiver = registry.receiver(self.receiver_key)
        return {
            "delivery_id": self.delivery_id,
            "event_id": self.event_id,
            "event_name": self.event_name,
            "receiver_key": self.receiver_key,
            "attempt": self.attempt,
            "status": status.value if status is not None else "",
            "worker_id": self.worker_id,
            "lane": receiver.lane if receiver is not None else "",
        }

    def signal_arguments(self, timing: dict[str, float | None]) -> dict[str, Any]:
        """What every delivery signal sends about the attempt (see ``signals``)."""
        registered = registry.event_named(self.event_name)
        return {
            "sender": registered.event_class if registered is not None else None,
            "delivery_id": self.delivery_id,
            "event_id": self.event_id,
            "event_name": self.event_name,
            "receiver_key": self.receiver_key,
            "attempt": self.attempt,
            "duration": timing.get("duration"),
            "lag": timing.get("lag"),
        }

    def failure(self, status: DeliveryStatus, error: BaseException) -> DeliveryFailure:
        """What the receiver's ``on_failure`` is handed."""
        return DeliveryFailure(
            delivery_id=self.delivery_id,
            event_id=self.event_id,
            event_name=self.event_name,
            receiver_key=self.receiver_key,
            target=self.target,
            attempt=self.attempt,
            status=status,
            error=error,
        )


def log_fields(
    claim: Claim, status: DeliveryStatus | None = None, *, attempt: int | None = None
) -> dict[str, Any]:
    """The ``extra=`` fields of a record about ``claim``'s attempt."""
    return Subject.of_claim(claim, attempt=attempt).log_fields(status)


def _timed(claim: Claim, timing: Timing | None) -> dict[str, float | None]:
    return timing.signal_arguments(claim) if timing is not None else {}


def report_success(claim: Claim, timing: Timing | None = None) -> None:
    """A success is committed: log it at DEBUG and send ``delivery_succeeded`` (their
    arguments built only when a handler or a listener will see them: a publisher reports
    thousands of successes a second)."""
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "Delivery %s of %s #%s to %s succeeded on attempt %s.",
            claim.id,
            claim.event_name,
            claim.event_id,
            claim.receiver_key,
            claim.attempts + 1,
            extra=log_fields(claim, DeliveryStatus.SUCCEEDED),
        )
    if signals.delivery_succeeded.receivers:
        subject = Subject.of_claim(claim)
        signals.delivery_succeeded.send(**subject.signal_arguments(_timed(claim, timing)))


def report_failure(
    claim: Claim,
    status: DeliveryStatus,
    reason: str,
    error: BaseException,
    timing: Timing | None = None,
) -> None:
    """A failure at WARNING, without a traceback; a dead letter at ERROR, with one."""
    subject = Subject.of_claim(claim)
    dead = status is DeliveryStatus.DEAD
    logger.log(
        logging.ERROR if dead else logging.WARNING,
        "Delivery %s of %s #%s to %s failed on attempt %s with %s; now %s: %s",
        claim.id,
        claim.event_name,
        claim.event_id,
        claim.receiver_key,
        subject.attempt,
        type(error).__name__,
        status.value,
        reason,
        exc_info=(type(error), error, error.__traceback__) if dead else None,
        extra=subject.log_fields(status),
    )
    signal = signals.delivery_dead if dead else signals.delivery_failed
    signal.send(**subject.signal_arguments(_timed(claim, timing)), error=error, last_error=reason)


def report_unrun(subject: Subject, status: DeliveryStatus, reason: str) -> None:
    """A row settled without running: WARNING when orphaned, ERROR when dead-lettered."""
    dead = status is DeliveryStatus.DEAD
    logger.log(
        logging.ERROR if dead else logging.WARNING,
        "Delivery %s of %s #%s to %s was settled without running; now %s: %s",
        subject.delivery_id,
        subject.event_name,
        subject.event_id,
        subject.receiver_key,
        status.value,
        reason,
        extra=subject.log_fields(status),
    )
    if dead:
        signals.delivery_dead.send(
            **subject.signal_arguments({}), error=RuntimeError(reason), last_error=reason
        )


def warn_lease_lost(claim: Claim, *, ran: bool) -> None:
    """The claim lapsed and another worker holds the row: before its turn (``ran`` False,
    so it was not run here) or before its outcome was recorded."""
    if ran:
        what = (
            "lapsed before the outcome was recorded, and another worker holds the row; "
            "nothing was recorded. If the receiver needs longer, declare "
            "@receiver(..., lease_seconds=...) (on SQLite) or raise RUN_LIMIT_SECONDS "
            "(elsewhere, where a heartbeat renews the lease)."
        )
    else:
        what = (
            "lapsed before its turn in the batch and another worker took the row over; it "
            "was not run here. If batches take longer than the lease, lower the batch size "
            "or raise LEASE_SECONDS."
        )
    logger.warning(
        "Delivery %s to %s: the lease taken at %s by %s %s",
        claim.id,
        claim.receiver_key,
        claim.claimed_at.isoformat(),
        claim.claimed_by,
        what,
        extra=log_fields(claim),
    )
