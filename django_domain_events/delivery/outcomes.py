"""What a receiver can say about an attempt, and what the row becomes because of it.

``decide()`` is the single place where an exception raised by a receiver is turned into
the row's next status and time; ``run.py`` writes what it decides.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .. import clock, conf
from ..declare import RegisteredReceiver
from ..models import DeliveryStatus
from ..retry import Exponential, RetryPolicy


class PermanentFailure(Exception):
    """Raise from a receiver when retrying cannot help: the row is dead on this attempt."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


class RetryAfter(Exception):
    """Raise when the destination asked to come back later.

    Spends an attempt unless ``counts=False``; with ``counts=False`` (and a declared
    ``give_up_after``) the attempt is not spent, the wait is jittered up to twice
    ``seconds``, and the receiver's lane is paused in this relay for ``seconds``.
    """

    def __init__(self, seconds: float, reason: str = "", counts: bool = True) -> None:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or math.isnan(seconds)
            or seconds < 0
        ):
            raise ValueError(f"RetryAfter(seconds=) must be a number >= 0, not {seconds!r}.")
        super().__init__(reason or f"retry after {seconds}s")
        self.seconds = float(seconds)
        self.reason = reason
        self.counts = bool(counts)


class NotYet(Exception):  # noqa: N818 - the name is the public contract
    """Raise when the work itself is not due until ``until``: the row waits, spending nothing.

    ``until`` must be in the future and aware (naive local time under ``USE_TZ = False``);
    both are checked here, so a bad one is an ordinary failure with this message.
    """

    def __init__(self, until: datetime, reason: str = "") -> None:
        until = clock.accept(until, what="NotYet(until=)")
        if until <= clock.now():
            raise ValueError(
                f"NotYet(until={until.isoformat()}) is not in the future: a row rescheduled "
                "to a time already come would be claimed straight back. Proceed with the "
                "work instead."
            )
        super().__init__(reason or f"not until {until.isoformat()}")
        self.until = until
        self.reason = reason


@dataclass(frozen=True)
class DeliveryContext:
    """What a receiver may know about the delivery it is running in."""

    event_id: int
    event_name: str
    attempt: int
    actor_key: str
    actor_label: str
    scope: dict[str, Any]
    target: str
    delivery_id: int | None
    due_at: datetime | None
    receiver_key: str
    occurred_at: datetime | None = None
    correlation_id: str = ""
    trace_context: str = ""  # the W3C trace context the event was fired in, or ""


@dataclass(frozen=True)
class DeliveryFailure:
    """Handed to a receiver's ``on_failure`` once a failed or dead attempt is recorded."""

    delivery_id: int
    event_id: int
    event_name: str
    receiver_key: str
    target: str
    attempt: int
    status: DeliveryStatus
    error: BaseException


@dataclass(frozen=True)
class Outcome:
    """The row's next state after an attempt that did not succeed."""

    status: DeliveryStatus
    spent: bool  # does this attempt count against max_attempts?
    available_at: datetime | None = None
    due_at: datetime | None = None
    expires_at: datetime | None = None
    last_error: str = ""
    pause_seconds: float = 0.0
    warnings: tuple[str, ...] = field(default=())

    @property
    def tells_on_failure(self) -> bool:
        return self.status in (DeliveryStatus.FAILED, DeliveryStatus.DEAD)


MAX_ERROR_CHARS = 4000  # last_error keeps this much of a message; MariaDB's TEXT holds 64 KB


def describe_error(error: BaseException) -> str:
    """``Type: message``, as ``last_error`` stores it; never raises.

    The message is what ``str()`` gives, else ``repr()``, else a placeholder; it is cut
    to ``MAX_ERROR_CHARS`` and cleaned of what a database refuses to store (NUL, lone
    surrogates), so recording a failure cannot itself fail.
    """
    name = clean_text(type(error).__name__)
    text = _message(error)
    if len(text) > MAX_ERROR_CHARS:
        text = f"{text[:MAX_ERROR_CHARS]}... ({len(text) - MAX_ERROR_CHARS} more characters)"
    text = clean_text(text)
    return f"{name}: {text}" if text else name


def _message(error: BaseException) -> str:
    for render in (str, repr):
        try:
            text = render(error)
        except Exception:
            continue
        if isinstance(text, str):
            return text
    return "<the message could not be rendered: str() and repr() both raised>"


def clean_text(text: str) -> str:
    """``text`` as every supported database stores it: NUL and lone surrogates escaped."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def retry_policy(receiver: RegisteredReceiver) -> RetryPolicy:
    """The receiver's policy, read live: ``retry=``, its backoff knobs, or the settings."""
    if receiver.retry is not None:
        return receiver.retry
    settings = conf.get()
    base = receiver.backoff_base_seconds or settings.BACKOFF_BASE_SECONDS
    cap = receiver.backoff_cap_seconds or settings.BACKOFF_CAP_SECONDS
    return Exponential(base, max(cap, base))


def _policy_name(policy: RetryPolicy) -> str:
    return type(policy).__name__


def decide(
    receiver: RegisteredReceiver,
    error: BaseException,
    *,
    attempt: int,
    max_attempts: int | None,
    due_at: datetime,
    now: datetime,
    expires_at: datetime | None = None,
) -> Outcome:
    """The row's fate after ``error`` ended attempt number ``attempt`` at ``now``."""
    return _decide(receiver, error, _Attempt(attempt, max_attempts, due_at, now, expires_at))


@dataclass(frozen=True)
class _Attempt:
    """Where the row stood when the attempt ended: what retrying or ending turns on."""

    number: int
    max_attempts: int | None
    due_at: datetime
    now: datetime
    expires_at: datetime | None


def _decide(receiver: RegisteredReceiver, error: BaseException, at: _Attempt) -> Outcome:
    if isinstance(error, NotYet):
        return Outcome(
            status=DeliveryStatus.PENDING,
            spent=False,
            available_at=error.until,
            due_at=error.until,
            expires_at=receiver_lifetime_end(receiver, error.until),
        )
    message = describe_error(error)
    if isinstance(error, PermanentFailure):
        return Outcome(DeliveryStatus.DEAD, spent=True, last_error=message)
    if isinstance(error, RetryAfter) and not error.counts:
        return _deferral(receiver, error, at)
    warnings: tuple[str, ...] = ()
    if isinstance(error, RetryAfter):
        delay, warnings = _capped(error.seconds, receiver)
    else:
        policy = retry_policy(receiver)
        wanted, warnings = _policy_delay(policy, at.number, error)
        if wanted is None:
            return Outcome(
                DeliveryStatus.DEAD,
                spent=True,
                last_error=f"{message} (retry policy {_policy_name(policy)} gave up)",
            )
        delay = wanted
    return _retry_or_end(receiver, message, delay, warnings, at)


def _retry_or_end(
    receiver: RegisteredReceiver,
    message: str,
    delay: float,
    warnings: tuple[str, ...],
    at: _Attempt,
) -> Outcome:
    """A counted failure to retry ``delay`` seconds on, unless the row's attempts,
    ``give_up_after`` or lifetime end it first."""
    if at.max_attempts is not None and at.number >= at.max_attempts:
        return Outcome(DeliveryStatus.DEAD, spent=True, last_error=message, warnings=warnings)
    bound = receiver.give_up_after
    if at.max_attempts is None and bound is not None and at.now - at.due_at >= bound:
        # Unbounded attempts end by time: owed this long, the row gives up.
        return Outcome(
            DeliveryStatus.DEAD,
            spent=True,
            last_error=f"{message} (gave up: owed longer than give_up_after={bound})",
            warnings=warnings,
        )
    retry_at = at.now + timedelta(seconds=max(delay, 0.0))
    if at.expires_at is not None and retry_at >= at.expires_at:
        # The next attempt would come after the row's lifetime: it ends here.
        reason = expired_reason(receiver, at.expires_at)
        return Outcome(
            DeliveryStatus.DEAD, spent=True, last_error=f"{reason} Last error: {message}"
        )
    return Outcome(
        DeliveryStatus.FAILED,
        spent=True,
        available_at=retry_at,
        last_error=message,
        warnings=warnings,
    )


def _policy_delay(
    policy: RetryPolicy, attempt: int, error: BaseException
) -> tuple[float | None, tuple[str, ...]]:
    """The policy's delay; a policy that raises or answers nonsense falls back to the
    default backoff with a warning, so a bug in it never stops the relay or loses a row."""
    try:
        wanted = policy.delay(attempt, error)
        if wanted is None:
            return None, ()
        delay = float(wanted)
        if not math.isfinite(delay) or delay < 0:
            raise ValueError(f"returned {wanted!r}, not a number of seconds >= 0")
    except Exception as problem:
        settings = conf.get()
        fallback = Exponential(settings.BACKOFF_BASE_SECONDS, settings.BACKOFF_CAP_SECONDS)
        return float(fallback.delay(attempt, error)), (
            f"retry policy {_policy_name(policy)} failed ({describe_error(problem)}); "
            "the default backoff was used instead. Fix its delay().",
        )
    return delay, ()


def _capped(seconds: float, receiver: RegisteredReceiver) -> tuple[float, tuple[str, ...]]:
    cap = conf.get().MAX_RECEIVER_RETRY_DELAY_SECONDS
    if seconds <= cap:
        return seconds, ()
    return cap, (
        f"{receiver.key} asked to retry after {seconds:g}s, more than "
        f"MAX_RECEIVER_RETRY_DELAY_SECONDS ({cap:g}s); waiting {cap:g}s instead.",
    )


_uncounted_warned: set[str] = set()


def _deferral(receiver: RegisteredReceiver, error: RetryAfter, at: _Attempt) -> Outcome:
    """``RetryAfter(counts=False)``: unspent, jittered upward, bounded by ``give_up_after``."""
    message = describe_error(error)
    if receiver.give_up_after is None:
        warnings: tuple[str, ...] = ()
        if receiver.key not in _uncounted_warned:
            _uncounted_warned.add(receiver.key)
            warnings = (
                f"{receiver.key} raised RetryAfter(counts=False) without give_up_after=; "
                "it is counted as an attempt so the delivery still ends. Declare "
                "give_up_after= to defer without spending attempts.",
            )
        counted = RetryAfter(error.seconds, error.reason, counts=True)
        outcome = _decide(receiver, counted, at)
        return Outcome(**{**outcome.__dict__, "warnings": warnings + outcome.warnings})
    if at.now - at.due_at >= receiver.give_up_after:
        return Outcome(
            DeliveryStatus.DEAD,
            spent=False,
            last_error=f"{message} (gave up: owed longer than give_up_after="
            f"{receiver.give_up_after})",
        )
    seconds, warnings = _capped(error.seconds, receiver)
    wait = seconds * (1.0 + random.random())
    return Outcome(
        DeliveryStatus.FAILED,
        spent=False,
        available_at=at.now + timedelta(seconds=wait),
        last_error=message,
        pause_seconds=seconds,
        warnings=warnings,
    )


def lifetime(receiver: RegisteredReceiver | None) -> tuple[timedelta | None, str]:
    """A receiver's lifetime and where it comes from: its ``ttl=``, else
    ``MESSAGE_TTL_SECONDS``, else none. The one place this rule lives."""
    if receiver is not None and receiver.ttl is not None:
        return receiver.ttl, f"ttl={receiver.ttl}"
    seconds = conf.get().MESSAGE_TTL_SECONDS
    if seconds is None:
        return None, "its lifetime"
    return timedelta(seconds=seconds), f"MESSAGE_TTL_SECONDS={seconds:g}"


def receiver_lifetime_end(receiver: RegisteredReceiver | None, due_at: datetime) -> datetime | None:
    """``due_at`` plus the receiver's lifetime, or None when it has none."""
    ttl, _ = lifetime(receiver)
    return None if ttl is None else due_at + ttl


def expired_reason(receiver: RegisteredReceiver | None, expires_at: datetime) -> str:
    """``last_error`` of a row that outlived its lifetime: starts ``expired:``, names the ttl."""
    _, source = lifetime(receiver)
    return (
        f"expired: still owed when its lifetime ({source}) ended at {expires_at.isoformat()}; "
        "it was dead-lettered without running again."
    )
