"""Helpers the test modules share: firing in a committed transaction, a failing receiver,
a race's interleaving forced in one process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from io import StringIO
from typing import Any

from django.core.management import call_command
from django.db import connection, transaction

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


@contextmanager
def just_before(verb: str, model: type, change: Callable[[], object]) -> Iterator[None]:
    """Run ``change``, a real write as another process would make it, right before the
    first ``verb`` statement (``"DELETE"``, ``"UPDATE"``) on ``model``'s table: the
    interleaving a race between a read and a write would produce, forced."""
    table = model._meta.db_table  # type: ignore[attr-defined]
    done = False

    def interleave(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal done
        if not done and sql.lstrip().upper().startswith(verb) and table in sql:
            done = True
            change()
        return execute(sql, params, many, context)

    with connection.execute_wrapper(interleave):
        yield
    assert done, f"no {verb} on {table} was run"
