"""The ``DJANGO_DOMAIN_EVENTS`` settings dict, merged over the defaults and validated.

Validation lives here so that ``manage.py check`` and the first use of a setting
tell the same story: the key, the bad value and what to write instead.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

SETTINGS_NAME = "DJANGO_DOMAIN_EVENTS"


@dataclass(frozen=True)
class Settings:
    """The package's settings, after merging and validation."""

    CODEC: str = "django_domain_events.codec.DataclassCodec"
    WARN_OUTSIDE_ATOMIC: bool = True
    BATCH_SIZE: int = 50
    CONCURRENCY: int = 1
    LEASE_SECONDS: float = 300.0
    RUN_LIMIT_SECONDS: float = 3600.0
    POLL_SECONDS: float = 1.0
    WAKE: str = "notify"
    NOTIFY_COALESCE_SECONDS: float = 0.5
    BACKOFF_BASE_SECONDS: float = 2.0
    BACKOFF_CAP_SECONDS: float = 3600.0
    MAX_RECEIVER_RETRY_DELAY_SECONDS: float = 86400.0
    RETENTION_DAYS: float = 90
    PRUNE_BATCH_ROWS: int = 5000
    RELAY_PRUNE: bool = True
    RELAY_PRUNE_SECONDS: float = 60.0
    TASK_BACKEND: Any = None
    AROUND_DELIVERY: str | None = None
    MESSAGE_TTL_SECONDS: float | None = None
    DEAD_LETTER_TTL_SECONDS: float | None = None
    SHUTDOWN_TIMEOUT_SECONDS: float | None = None
    ORPHAN_AFTER_SECONDS: float = 3600.0
    # A row waiting longer than this goes before every row that comes due after it,
    # whatever its priority (priority.py).
    PRIORITY_AGING_SECONDS: float = 60.0
    # Limits shared by a named group of receivers (``@receiver(limit_group=)``) and by
    # every receiver of a lane: name -> {"rate_limit": "50/s", "concurrency_limit": 10}.
    LIMIT_GROUPS: Any = None
    LANE_LIMITS: Any = None
    # contrib.brokers: named brokers (checked by contrib/brokers/config.py) and the
    # CloudEvents ``source`` of what this service publishes (None: the project's name).
    BROKERS: Any = None
    EVENT_SOURCE: str | None = None


KEYS = tuple(f.name for f in fields(Settings))

_POSITIVE_NUMBERS = (
    "LEASE_SECONDS",
    "RUN_LIMIT_SECONDS",
    "POLL_SECONDS",
    "BACKOFF_BASE_SECONDS",
    "BACKOFF_CAP_SECONDS",
    "MAX_RECEIVER_RETRY_DELAY_SECONDS",
    "RETENTION_DAYS",
    "RELAY_PRUNE_SECONDS",
    "PRIORITY_AGING_SECONDS",
)
_POSITIVE_INTS = ("BATCH_SIZE", "CONCURRENCY", "PRUNE_BATCH_ROWS")
_NON_NEGATIVE_NUMBERS = ("NOTIFY_COALESCE_SECONDS", "ORPHAN_AFTER_SECONDS")
_OPTIONAL_POSITIVE_NUMBERS = ("MESSAGE_TTL_SECONDS", "DEAD_LETTER_TTL_SECONDS")
_BOOLS = ("WARN_OUTSIDE_ATOMIC", "RELAY_PRUNE")
_DOTTED_PATHS = ("CODEC",)
_OPTIONAL_DOTTED_PATHS = ("AROUND_DELIVERY",)


MAX_BATCH_SIZE = 10_000  # rows one claim may take; larger batches only hold leases longer
MAX_CONCURRENCY = 256  # rows one relay runs at once per lane, each on its own connection
_CAPS = {"BATCH_SIZE": MAX_BATCH_SIZE, "CONCURRENCY": MAX_CONCURRENCY}


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def count_problem(what: str, value: object, most: int) -> str | None:
    """Why ``value`` is not a whole number from 1 to ``most``, or None when it is.

    The one rule for a batch size and a concurrency, whether a setting, a relay's
    argument or a command's option gives it.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        return f"{what} must be a whole number from 1 to {most}, not {value!r}."
    return None


def problems(raw: object) -> list[str]:
    """Every reason ``raw`` is not a valid settings dict, as sentences."""
    if not isinstance(raw, dict):
        return [f"{SETTINGS_NAME} must be a dict, not {type(raw).__name__}."]
    return [problem for check in _CHECKS for problem in check(raw)]


def _unknown_keys(raw: dict[Any, Any]) -> Iterator[str]:
    for key in raw:
        if key not in KEYS:
            close = difflib.get_close_matches(str(key), KEYS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            yield f"{SETTINGS_NAME}[{key!r}] is not a setting of this package.{hint}"


def _numbers(raw: dict[Any, Any]) -> Iterator[str]:
    for key in _POSITIVE_NUMBERS:
        value = raw.get(key, 1)
        if not _is_number(value) or value <= 0:
            yield f"{SETTINGS_NAME}[{key!r}] must be a positive number, not {value!r}."
    for key in _POSITIVE_INTS:
        value = raw.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            yield f"{SETTINGS_NAME}[{key!r}] must be a whole number >= 1, not {value!r}."
        elif key in _CAPS and value > _CAPS[key]:
            yield str(count_problem(f"{SETTINGS_NAME}[{key!r}]", value, _CAPS[key]))


def _optional_seconds(raw: dict[Any, Any]) -> Iterator[str]:
    for key in _OPTIONAL_POSITIVE_NUMBERS:
        value = raw.get(key)
        if value is not None and (not _is_number(value) or value <= 0):
            yield (
                f"{SETTINGS_NAME}[{key!r}] must be None (no lifetime) or a positive number "
                f"of seconds, not {value!r}."
            )
    shutdown = raw.get("SHUTDOWN_TIMEOUT_SECONDS")
    if shutdown is not None and (not _is_number(shutdown) or shutdown <= 0):
        yield (
            f"{SETTINGS_NAME}['SHUTDOWN_TIMEOUT_SECONDS'] must be None (wait for the rows "
            f"being run) or a positive number of seconds, not {shutdown!r}."
        )


def _flags_and_paths(raw: dict[Any, Any]) -> Iterator[str]:
    for key in _BOOLS:
        value = raw.get(key, True)
        if not isinstance(value, bool):
            yield f"{SETTINGS_NAME}[{key!r}] must be True or False, not {value!r}."
    for key in _DOTTED_PATHS + _OPTIONAL_DOTTED_PATHS:
        value = raw.get(key, "a.b")
        if value is None and key in _OPTIONAL_DOTTED_PATHS:
            continue
        if not isinstance(value, str) or "." not in value:
            yield f"{SETTINGS_NAME}[{key!r}] must be a dotted import path, not {value!r}."
    wake = raw.get("WAKE", "notify")
    if wake not in ("notify", "poll"):
        yield f"{SETTINGS_NAME}['WAKE'] must be 'notify' or 'poll', not {wake!r}."


def _timing(raw: dict[Any, Any]) -> Iterator[str]:
    for key in _NON_NEGATIVE_NUMBERS:
        value = raw.get(key, 0)
        if not _is_number(value) or value < 0:
            yield f"{SETTINGS_NAME}[{key!r}] must be a number >= 0, not {value!r}."
    base = raw.get("BACKOFF_BASE_SECONDS", Settings.BACKOFF_BASE_SECONDS)
    cap = raw.get("BACKOFF_CAP_SECONDS", Settings.BACKOFF_CAP_SECONDS)
    if _is_number(base) and _is_number(cap) and cap < base:
        yield (
            f"{SETTINGS_NAME}['BACKOFF_CAP_SECONDS'] ({cap!r}) is below "
            f"BACKOFF_BASE_SECONDS ({base!r}); raise the cap or lower the base."
        )


def _integrations(raw: dict[Any, Any]) -> Iterator[str]:
    """The settings of the task hand-off and the brokers, in outline (each integration
    checks its own in full when configured)."""
    backend = raw.get("TASK_BACKEND")
    if backend is not None and not (
        (isinstance(backend, str) and "." in backend)
        or (isinstance(backend, dict) and isinstance(backend.get("BACKEND"), str))
    ):
        yield (
            f"{SETTINGS_NAME}['TASK_BACKEND'] must be a dotted path or a dict with a "
            f"'BACKEND' dotted path, not {backend!r}."
        )
    source = raw.get("EVENT_SOURCE")
    if source is not None and (not isinstance(source, str) or not source.strip()):
        yield f"{SETTINGS_NAME}['EVENT_SOURCE'] must be a non-empty string, not {source!r}."
    brokers = raw.get("BROKERS")
    if brokers is not None and not isinstance(brokers, dict):
        yield (
            f"{SETTINGS_NAME}['BROKERS'] must be a dict of broker name -> {{'URL': ...}}, "
            f"not {brokers!r}."
        )


_LIMIT_OPTIONS = ("rate_limit", "concurrency_limit")


def _shared_limits(raw: dict[Any, Any]) -> Iterator[str]:
    """``LIMIT_GROUPS`` and ``LANE_LIMITS``: each name maps to a rate and/or a concurrency,
    written as the receiver options are."""
    for setting, what in (("LIMIT_GROUPS", "group"), ("LANE_LIMITS", "lane")):
        declared = raw.get(setting)
        if declared is None:
            continue
        if not isinstance(declared, dict):
            yield (
                f"{SETTINGS_NAME}[{setting!r}] must be a dict of {what} name -> "
                f"{{'rate_limit': '50/s', 'concurrency_limit': 10}}, not {declared!r}."
            )
            continue
        for name, limit in declared.items():
            yield from _shared_limit(f"{SETTINGS_NAME}[{setting!r}][{name!r}]", name, limit)


def _shared_limit(where: str, name: object, limit: object) -> Iterator[str]:
    from .receiver_options import MAX_LANE_LENGTH, per_second  # imports nothing of Django

    if not isinstance(name, str) or not name.strip() or len(name) > MAX_LANE_LENGTH:
        yield f"{where}: the name must be a non-empty string of at most {MAX_LANE_LENGTH} chars."
        return
    if not isinstance(limit, dict) or not limit or set(limit) - set(_LIMIT_OPTIONS):
        yield (
            f"{where} must be a dict with 'rate_limit' (such as '50/s') and/or "
            f"'concurrency_limit' (an int >= 1), not {limit!r}."
        )
        return
    if all(limit.get(option) is None for option in _LIMIT_OPTIONS):
        yield f"{where} limits nothing: give it a 'rate_limit' or a 'concurrency_limit'."
    rate = limit.get("rate_limit")
    if rate is not None:
        try:
            per_second(rate, where=f"{where}['rate_limit']")
        except ValueError as error:
            yield str(error)
    concurrency = limit.get("concurrency_limit")
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        yield f"{where}['concurrency_limit'] must be an int >= 1 or None, not {concurrency!r}."


# In the order ``problems`` reports them.
_CHECKS: tuple[Callable[[dict[Any, Any]], Iterator[str]], ...] = (
    _unknown_keys,
    _numbers,
    _optional_seconds,
    _flags_and_paths,
    _timing,
    _integrations,
    _shared_limits,
)


_cached: Settings | None = None


def get() -> Settings:
    """The validated settings; raises ``ImproperlyConfigured`` naming every problem."""
    global _cached
    if _cached is None:
        raw = getattr(django_settings, SETTINGS_NAME, {})
        found = problems(raw)
        if found:
            raise ImproperlyConfigured(" ".join(found))
        _cached = Settings(**raw)
    return _cached


def _reset(*, setting: str, **kwargs: object) -> None:
    global _cached
    if setting == SETTINGS_NAME:
        _cached = None


setting_changed.connect(_reset)
