"""The event the benchmark fires. Receivers are declared at run time by ``bench/run.py``,
one set per measured case, and forgotten afterwards, so each case owes exactly the rows
it declares."""

from __future__ import annotations

from dataclasses import dataclass

from django_domain_events import event


@event
@dataclass(frozen=True)
class Tick:
    n: int
