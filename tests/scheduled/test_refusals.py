"""Seed 000, "What is refused at the decorator"."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest

from django_domain_events import INLINE, ON_COMMIT, DeliveryMode, event, receiver, registry

KEY = "scheduled.refused"


@event(name="scheduled.refusals.OfferMade")
@dataclass(frozen=True)
class OfferMade:
    offer_id: int = 0


def handler(evt: OfferMade) -> None:
    raise AssertionError("a refused receiver must never run")


def at(evt: OfferMade) -> datetime:
    return datetime(2031, 1, 1)


@pytest.mark.parametrize("mode", [INLINE, ON_COMMIT], ids=["inline", "on_commit"])
@pytest.mark.parametrize("due", [timedelta(hours=48), at], ids=["timedelta", "callable"])
def test_due_with_inline_or_on_commit_is_refused(mode: DeliveryMode, due: Any) -> None:
    """'mode=INLINE or ON_COMMIT: There is no delivery row to wait in'."""
    with pytest.raises(ValueError, match=r"due=.*delivery row.*writes none"):
        receiver(OfferMade, key=KEY, mode=mode, due=due)
    assert registry.receiver(KEY) is None


@pytest.mark.parametrize("due", [timedelta(hours=48), at], ids=["timedelta", "callable"])
def test_due_with_eager_is_refused(due: Any) -> None:
    """'eager=True: An eager attempt runs at commit, and a scheduled delivery is not due then'."""
    with pytest.raises(ValueError, match=r"due=.*eager=True.*not due then"):
        receiver(OfferMade, key=KEY, eager=True, due=due)
    assert registry.receiver(KEY) is None


@pytest.mark.parametrize("due", [timedelta(hours=48), at], ids=["timedelta", "callable"])
def test_due_with_targets_is_refused_pointing_at_a_follow_up_event(due: Any) -> None:
    """'targets=: A fan-out resolved at fire time would keep that recipient set until the row
    came due ...' and 'A scheduled fan-out is a follow-up event.'"""
    with pytest.raises(ValueError, match="targets=") as refused:
        receiver(OfferMade, key=KEY, targets=lambda evt, ctx: ["a"], due=due)
    message = str(refused.value)
    assert "due=" in message
    assert "follow-up event" in message and "targets=" in message
    assert registry.receiver(KEY) is None


@pytest.mark.parametrize(
    "due",
    [timedelta(0), timedelta(microseconds=-1), timedelta(hours=-48)],
    ids=["zero", "minus-1us", "minus-48h"],
)
def test_a_zero_or_negative_timedelta_is_refused(due: timedelta) -> None:
    """'A zero or negative timedelta: A delay that is not in the future is no schedule'."""
    with pytest.raises(ValueError, match=r"due=.*not in the future is no schedule"):
        receiver(OfferMade, key=KEY, due=due)
    assert registry.receiver(KEY) is None


@pytest.mark.parametrize(
    "due",
    [172800, 172800.0, "48h", datetime(2031, 1, 1), object()],
    ids=["int-seconds", "float-seconds", "string", "a-datetime", "object"],
)
def test_anything_but_a_timedelta_or_a_callable_is_a_type_error_at_the_decorator(
    due: Any,
) -> None:
    """'Anything but a timedelta or a callable: Refused with TypeError, rather than at the first
    fire'."""
    with pytest.raises(TypeError, match=r"due=.*timedelta or a callable"):
        receiver(OfferMade, key=KEY, due=due)  # before any function is even decorated
    assert registry.receiver(KEY) is None


def test_an_async_def_due_is_refused() -> None:
    """A due= callable 'runs inside the caller's transaction', at fire time: an async def cannot
    (API: 'an async def for targets or due' is refused at the decorator)."""

    async def when(evt: OfferMade) -> datetime:
        return datetime(2031, 1, 1)

    with pytest.raises(TypeError, match=r"due=.*async def"):
        receiver(OfferMade, key=KEY, due=when)
    assert registry.receiver(KEY) is None


def test_the_accepted_spellings_declare_a_scheduled_receiver() -> None:
    """The counterpart: 'due= takes one of two spellings' - a timedelta or a callable."""
    receiver(OfferMade, key=KEY, due=timedelta(hours=48))(handler)
    receiver(OfferMade, key=KEY + ".at", due=at)(handler)
    declared = registry.receiver(KEY)
    assert declared is not None and declared.due == timedelta(hours=48)
    declared_at = registry.receiver(KEY + ".at")
    assert declared_at is not None and declared_at.due is at
