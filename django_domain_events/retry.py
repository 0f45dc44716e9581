"""Retry policies: how long a failed delivery waits before its next attempt.

A policy answers one question, ``delay(attempt, error)``: seconds until the next
attempt, or ``None`` for "do not retry". ``attempt`` is the number of the attempt
that just failed (1 for the first). Policies are read live from the declaration, so a
deploy that changes one reaches rows already waiting.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, runtime_checkable


def backoff(attempt: int, *, base: float, cap: float, jitter: float) -> timedelta:
    """The exponential curve with full jitter, as a pure function.

    ``ceiling = min(base * 2 ** (attempt - 1), cap)`` and the wait is ``ceiling * jitter``,
    with ``jitter`` in [0, 1) supplied by the caller.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, not {attempt!r}.")
    if not 0 <= jitter < 1:
        raise ValueError(f"jitter must be in [0, 1), not {jitter!r}.")
    ceiling = min(base * 2.0 ** min(attempt - 1, 64), cap)
    return timedelta(seconds=ceiling * jitter)


@runtime_checkable
class RetryPolicy(Protocol):
    """Anything with ``delay(attempt, error) -> float | None``."""

    def delay(self, attempt: int, error: BaseException) -> float | None: ...


def _positive(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, not {value!r}.")
    return float(value)


@dataclass(frozen=True)
class Exponential:
    """Exponential backoff with full jitter: the default curve."""

    base: float
    cap: float

    def __post_init__(self) -> None:
        _positive(self.base, "Exponential(base=)")
        _positive(self.cap, "Exponential(cap=)")
        if self.cap < self.base:
            raise ValueError(
                f"Exponential(cap={self.cap!r}) is below base={self.base!r}; "
                "the cap must be at least the base."
            )

    def delay(self, attempt: int, error: BaseException) -> float:
        return backoff(
            attempt, base=self.base, cap=self.cap, jitter=random.random()
        ).total_seconds()


@dataclass(frozen=True)
class Constant:
    """The same wait after every failure, not jittered."""

    seconds: float

    def __post_init__(self) -> None:
        _positive(self.seconds, "Constant(seconds=)")

    def delay(self, attempt: int, error: BaseException) -> float:
        return float(self.seconds)


@dataclass(frozen=True)
class Linear:
    """``step * attempt`` seconds, capped at ``cap`` when given, not jittered."""

    step: float
    cap: float | None = None

    def __post_init__(self) -> None:
        _positive(self.step, "Linear(step=)")
        if self.cap is not None:
            _positive(self.cap, "Linear(cap=)")

    def delay(self, attempt: int, error: BaseException) -> float:
        wait = self.step * attempt
        return wait if self.cap is None else min(wait, self.cap)


def describe(policy: object) -> dict[str, object]:
    """The policy as the catalogue publishes it."""
    if isinstance(policy, Exponential):
        return {"kind": "exponential", "base": policy.base, "cap": policy.cap}
    if isinstance(policy, Constant):
        return {"kind": "constant", "seconds": policy.seconds}
    if isinstance(policy, Linear):
        return {"kind": "linear", "step": policy.step, "cap": policy.cap}
    cls = type(policy)
    return {"kind": "custom", "path": f"{cls.__module__}.{cls.__qualname__}"}
