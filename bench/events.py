"""The events the benchmark fires.

``Tick`` has no receiver here: ``bench/run.py`` declares them at run time, one set per
measured case of sections 1-4, and forgets them afterwards, so each case owes exactly the
rows it declares.

``Relayed`` has one no-op durable receiver declared here, at import, so that
autodiscovery declares it in every process alike: the benchmark's and the relay
processes it starts (``manage.py deliver_events``, sections 5-7).
"""

from __future__ import annotations

from dataclasses import dataclass

from django_domain_events import event, receiver

RELAY_NOOP_KEY = "bench.relay_noop"
BULKY_KEY = "bench.bulky"


@event
@dataclass(frozen=True)
class Tick:
    n: int


@event
@dataclass(frozen=True)
class Relayed:
    n: int


@receiver(Relayed, key=RELAY_NOOP_KEY)
def relay_noop(evt: Relayed) -> None:
    """Does nothing: what is measured is the relay around it."""


@event
@dataclass(frozen=True)
class Bulky:
    """A large payload (section 8): what a relay holds in memory while it delivers."""

    blob: str


@receiver(Bulky, key=BULKY_KEY, lane="bulky")
def bulky_noop(evt: Bulky) -> None:
    """Does nothing with the payload it was given: the relay's memory is what is measured."""
