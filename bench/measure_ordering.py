"""Section 16: ordered against unordered receivers, same workload, same run, in process.

(a) 1,000 keys, a no-op receiver, one relay claiming ``BATCH`` at a time
    (``deliver_pending``): rows per second, ordered and unordered, in alternating rounds.
(b) 1,000 keys, a 50 ms receiver, one relay with ``--concurrency 16``
    (``run_relay(once=True, concurrency=16)``): rows per second, alike.
(c) one hot key, a 50 ms receiver, ``--concurrency 16``: the rows run one at a time;
    the relay's CPU seconds per wall second while fifteen slots wait for the one.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction

from django_domain_events import deliver_pending, fire, receiver, registry, run_relay
from django_domain_events.models import DeliveryRecord, DeliveryStatus

from .events import Tick

KEY = "bench.ordering"
KEYS = 1_000
BATCH = 100


@dataclass(frozen=True)
class Rate:
    rows: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.rows / self.seconds


def _declare(ordered: bool, keys: int, sleep: float) -> None:
    options = {"ordered_by": (lambda evt: evt.n % keys)} if ordered else {}

    def run(evt: Tick) -> None:
        if sleep:
            time.sleep(sleep)

    registry.forget(KEY)
    receiver(Tick, key=KEY, **options)(run)  # type: ignore[arg-type]


def _fire(rows: int) -> None:
    for start in range(0, rows, 500):
        with transaction.atomic():
            for n in range(start, min(start + 500, rows)):
                fire(Tick(n=n))


def _timed(drain: Callable[[], object], rows: int) -> Rate:
    began = time.perf_counter()
    drain()
    seconds = time.perf_counter() - began
    left = DeliveryRecord.objects.filter(receiver_key=KEY).exclude(status=DeliveryStatus.SUCCEEDED)
    if left.exists():
        raise RuntimeError(f"{left.count()} rows were not delivered")
    DeliveryRecord.objects.filter(receiver_key=KEY).delete()
    return Rate(rows, seconds)


def one_relay(rows: int, ordered: bool) -> Rate:
    """(a): a no-op receiver, ``deliver_pending`` in batches of ``BATCH``."""
    _declare(ordered, KEYS, 0.0)
    _fire(rows)
    return _timed(lambda: deliver_pending(batch_size=BATCH), rows)


def concurrent(rows: int, ordered: bool, keys: int = KEYS) -> tuple[Rate, float]:
    """(b) and (c): a 50 ms receiver, ``run_relay(once=True, concurrency=16)``; the rate
    and the relay's CPU seconds per wall second."""
    _declare(ordered, keys, 0.05)
    _fire(rows)
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    rate = _timed(lambda: run_relay(once=True, concurrency=16, prune=None), rows)
    after = resource.getrusage(resource.RUSAGE_SELF)
    used = (after.ru_utime - cpu.ru_utime) + (after.ru_stime - cpu.ru_stime)
    return rate, used / rate.seconds


def forget() -> None:
    registry.forget(KEY)
