"""The package's clock: every datetime it writes, compares or returns follows ``USE_TZ``.

Under ``USE_TZ = True`` datetimes are aware; under ``False`` they are naive local time
(``TIME_ZONE``), and an aware value handed in is converted to that local time.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.utils import timezone


def now() -> datetime:
    """The current time, aware or naive as ``USE_TZ`` says."""
    return timezone.now()


def normalize(value: datetime) -> datetime:
    """``value`` in the project's convention; aware input under ``USE_TZ = False`` goes local."""
    if not settings.USE_TZ and timezone.is_aware(value):
        return timezone.make_naive(value)
    return value


def accept(value: object, *, what: str) -> datetime:
    """``value`` as a datetime the project can store, or a ``TypeError`` naming ``what``.

    A naive datetime is refused under ``USE_TZ = True``: read as UTC or as local time it
    would be wrong for somebody by hours. Under ``USE_TZ = False`` naive is local time.
    """
    if not isinstance(value, datetime):
        raise TypeError(f"{what} must be a datetime, not {type(value).__name__} ({value!r}).")
    if settings.USE_TZ and timezone.is_naive(value):
        raise TypeError(
            f"{what} must be an aware datetime, got the naive {value.isoformat()}; "
            "attach a time zone (for example timezone.make_aware(value))."
        )
    return normalize(value)
