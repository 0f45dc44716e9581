"""What a relay may be asked to do: its lanes, batch sizes, concurrency and stop bound.

``run_relay`` and ``manage.py deliver_events`` check their options here, before a row
is claimed, so a mistake is refused with the fix rather than paid for by a row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from django.db import connections

from .. import conf
from ..codec import get_codec
from ..declare import registry
from .passes import check_sizes
from .run import around_hook
from .tasks import get_backend


def check_lanes(lanes: Iterable[str]) -> list[str]:
    """The lanes, sorted; refuses one that no receiver declares."""
    declared = registry.lanes()
    chosen = sorted(set(lanes))
    for lane in chosen:
        if lane not in declared:
            raise ValueError(
                f"No receiver declares lane {lane!r}; declared lanes are "
                f"{', '.join(sorted(declared))}. Check the spelling, or declare "
                f"@receiver(..., lane={lane!r})."
            )
    return chosen


def check_relay_options(
    lane: str | Sequence[str], batch_size: int | None, lane_batch_sizes: Mapping[str, int] | None
) -> list[str]:
    """The lanes a relay serves, after refusing any option it cannot run with."""
    lanes = check_lanes([lane] if isinstance(lane, str) else lane)
    check_sizes(batch_size, lane_batch_sizes)
    for name in lane_batch_sizes or {}:
        if name not in lanes:
            raise ValueError(
                f"lane {name!r} has a batch size but this relay does not serve it; serve "
                f"lane {name!r} too, or drop its size."
            )
    return lanes


def check_configuration(lanes: Sequence[str]) -> None:
    """Load every dotted-path setting a relay of ``lanes`` will use, before it claims a row.

    Raises ``ImproperlyConfigured`` naming the setting: a codec, hook or task backend
    that cannot be loaded is the deployment's error, and no row should pay for it.
    """
    settings = conf.get()
    get_codec()
    if settings.AROUND_DELIVERY is not None:
        around_hook(settings.AROUND_DELIVERY)
    served = {key for lane in lanes for key in registry.lanes().get(lane, ())}
    if any(r.durable and r.site == "task" and r.key in served for r in registry.receivers):
        get_backend()


def refuse_concurrency_on_sqlite(alias: str, slots: Mapping[str, int]) -> None:
    """SQLite has one writer: a relay on it runs one row at a time."""
    if connections[alias].vendor == "sqlite" and any(n > 1 for n in slots.values()):
        raise ValueError(
            "SQLite has a single writer, so a relay on it runs one delivery at a time; drop "
            "the concurrency, or move to PostgreSQL or MariaDB to run several at once."
        )


def check_shutdown_timeout(seconds: float | None) -> float | None:
    """The stop's bound in seconds (``SHUTDOWN_TIMEOUT_SECONDS`` when not given), or None;
    refuses a value that is not a positive number."""
    if seconds is None:
        return conf.get().SHUTDOWN_TIMEOUT_SECONDS
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise ValueError(
            f"the shutdown timeout must be a positive number of seconds, not {seconds!r}."
        )
    return float(seconds)


def lane_slots(
    lanes: Sequence[str], concurrency: int | None, lane_concurrency: Mapping[str, int] | None
) -> dict[str, int]:
    """How many rows of each lane a relay runs at once; refuses what cannot be."""
    default = concurrency if concurrency is not None else conf.get().CONCURRENCY
    chosen = [("the concurrency", default)]
    chosen += [(f"the concurrency of lane {k!r}", n) for k, n in (lane_concurrency or {}).items()]
    for what, n in chosen:
        problem = conf.count_problem(what, n, conf.MAX_CONCURRENCY)
        if problem is not None:
            raise ValueError(problem)
    for lane in lane_concurrency or {}:
        if lane not in lanes:
            raise ValueError(
                f"lane {lane!r} has a concurrency but this relay does not serve it; serve "
                f"lane {lane!r} too, or drop its concurrency."
            )
    return {lane: (lane_concurrency or {}).get(lane, default) for lane in lanes}
