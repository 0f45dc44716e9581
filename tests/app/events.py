"""Events the tests fire. Receivers are declared by each test, so counts stay local."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django_domain_events import Retention, event


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@event
@dataclass(frozen=True)
class OrderPlaced:
    order_id: int
    total: Decimal = Decimal("0")
    tags: tuple[str, ...] = ()


@event(name="testapp.OrderShipped", version=2)
@dataclass(frozen=True)
class OrderShipped:
    order_id: int
    carrier: str

    @staticmethod
    def upgrade(payload: dict, from_version: int) -> dict:
        if from_version == 1:
            payload["carrier"] = payload.pop("shipper", "unknown")
        return payload


@event
@dataclass(frozen=True)
class Pinged:
    n: int = 0
    when: datetime | None = None
    colour: Colour = Colour.RED
    labels: list[str] = field(default_factory=list)


# One event per retention policy, for the prune tests.


@event(retention=timedelta(hours=1))
@dataclass(frozen=True)
class Brief:
    n: int = 0


@event(retention=Retention.SUCCEEDED)
@dataclass(frozen=True)
class UntilConsumed:
    n: int = 0


@event(retention=Retention.SETTLED)
@dataclass(frozen=True)
class UntilSettled:
    n: int = 0


@event
@dataclass(frozen=True)
class ReportDue:
    """Fired by the tests' recurring schedules: ``tick`` is the tick, as ISO text."""

    tick: str
