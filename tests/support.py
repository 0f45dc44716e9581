"""Helpers the test modules share: firing in a committed transaction, a failing receiver."""

from __future__ import annotations

from datetime import datetime
from io import StringIO

from django.core.management import call_command
from django.db import transaction

from django_domain_events import fire


def fire_one(evt: object, *, occurred_at: datetime | None = None) -> int:
    """Fire ``evt`` in its own transaction and return the event id."""
    with transaction.atomic():
        event_id = fire(evt, occurred_at=occurred_at)
    assert event_id is not None
    return event_id


def failing(evt: object) -> None:
    """A receiver that always fails, as an unreachable destination would."""
    raise ConnectionError("unreachable")


def command(*args: str) -> str:
    """Run a management command and return what it printed."""
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()
