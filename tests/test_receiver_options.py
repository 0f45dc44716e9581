"""ReceiverOptions: one frozen value checked on creation, the same rules as @receiver."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from django_domain_events.declare import INLINE, ON_COMMIT
from django_domain_events.receiver_options import DURABLE, ReceiverOptions
from django_domain_events.retry import Exponential


def test_the_defaults_are_a_durable_receiver() -> None:
    options = ReceiverOptions()
    assert options.mode is DURABLE and options.durable
    assert (options.max_attempts, options.site, options.lane, options.ack) == (
        5,
        "relay",
        "default",
        "each",
    )


def test_options_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ReceiverOptions().lane = "slow"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"mode": "durable"}, TypeError, r"mode=\) must be DURABLE, INLINE or ON_COMMIT"),
        ({"mode": INLINE, "lane": "slow"}, ValueError, r"lane=\.\.\.\) describes a delivery row"),
        ({"mode": ON_COMMIT, "ack": "batch"}, ValueError, r"mode=ON_COMMIT writes none"),
        ({"max_attempts": None}, ValueError, "owed forever"),
        ({"max_attempts": 0}, ValueError, r"max_attempts=\) must be an int >= 1"),
        ({"site": "worker"}, ValueError, "'relay' or 'task'"),
        ({"lane": "x" * 65}, ValueError, "at most 64 chars"),
        ({"retry": Exponential(1, 2), "backoff_base_seconds": 1}, ValueError, "alone"),
        ({"ttl": timedelta(0)}, ValueError, r"ttl=\) must be a positive timedelta"),
        ({"ack": "all"}, ValueError, "'each'"),
        ({"due": timedelta(hours=1), "eager": True}, ValueError, "Drop eager=True"),
        ({"due": timedelta(hours=1), "targets": lambda e, c: []}, ValueError, "follow-up"),
        ({"on_failure": "log"}, TypeError, r"on_failure=\) must be callable"),
        ({"takes_context": 1}, TypeError, r"takes_context=\) must be True or False"),
    ],
)
def test_each_option_and_combination_is_checked_naming_the_fix(
    options: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ReceiverOptions(**options)  # type: ignore[arg-type]


def test_backoff_knobs_leave_no_stored_policy() -> None:
    assert ReceiverOptions(backoff_base_seconds=1.0).retry_policy is None
    policy = Exponential(1, 2)
    assert ReceiverOptions(retry=policy).retry_policy is policy


def test_non_durable_receivers_take_no_row_option_but_their_own() -> None:
    options = ReceiverOptions(mode=INLINE, takes_context=True)
    assert not options.durable and options.takes_context
