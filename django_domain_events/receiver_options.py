"""What a ``@receiver`` declaration may say, as one frozen, validated value.

:class:`ReceiverOptions` checks every option, and the combinations of options, when it
is built, naming the bad value and the fix, so a mistake fails the import rather than
the first fire. Adding an option is one field (``row=True`` in its metadata when it
describes a delivery row, which non-durable receivers then refuse) and one check, added
to :meth:`ReceiverOptions._checks` in the order its errors should win.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .retry import RetryPolicy

#: Longest lane name (the column's width).
MAX_LANE_LENGTH = 64


class DeliveryMode(enum.Enum):
    """How a receiver is run: inside the firing transaction, after it, or from a row."""

    INLINE = "inline"
    ON_COMMIT = "on_commit"
    DURABLE = "durable"


INLINE = DeliveryMode.INLINE
ON_COMMIT = DeliveryMode.ON_COMMIT
DURABLE = DeliveryMode.DURABLE

_ROW = {"row": True}  # the option describes a delivery row: DURABLE receivers only


def _positive_seconds(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"@receiver({name}=) must be a positive number of seconds, not {value!r}.")


def _positive_timedelta(value: object, name: str) -> None:
    if not isinstance(value, timedelta):
        raise TypeError(f"@receiver({name}=) must be a timedelta, not {value!r}.")
    if value <= timedelta(0):
        raise ValueError(f"@receiver({name}=) must be a positive timedelta, not {value!r}.")


def _sync_callable(value: object, name: str) -> None:
    if not callable(value):
        raise TypeError(f"@receiver({name}=) must be a callable, not {value!r}.")
    if inspect.iscoroutinefunction(value):
        raise TypeError(
            f"@receiver({name}=) must be a plain (sync) function: it runs inside fire()'s "
            "transaction, which cannot wait on a coroutine. Make it a def, not an async def."
        )


@dataclass(frozen=True)
class ReceiverOptions:
    """Every option of ``@receiver`` but the event class and the key, checked on creation.

    Raises ``TypeError`` or ``ValueError`` naming the option, the value and the fix.
    """

    mode: DeliveryMode = DURABLE
    max_attempts: int | None = field(default=5, metadata=_ROW)
    eager: bool = field(default=False, metadata=_ROW)
    site: str = field(default="relay", metadata=_ROW)
    lease_seconds: float | None = field(default=None, metadata=_ROW)
    takes_context: bool = False
    on_failure: Callable[..., Any] | None = None
    targets: Callable[..., Iterable[str]] | None = field(default=None, metadata=_ROW)
    backoff_base_seconds: float | None = field(default=None, metadata=_ROW)
    backoff_cap_seconds: float | None = field(default=None, metadata=_ROW)
    retry: RetryPolicy | None = field(default=None, metadata=_ROW)
    lane: str = field(default="default", metadata=_ROW)
    give_up_after: timedelta | None = field(default=None, metadata=_ROW)
    due: timedelta | Callable[[Any], Any] | None = field(default=None, metadata=_ROW)
    ttl: timedelta | None = field(default=None, metadata=_ROW)
    ack: str = field(default="each", metadata=_ROW)
    priority: int = field(default=0, metadata=_ROW)
    rate_limit: str | None = field(default=None, metadata=_ROW)
    concurrency_limit: int | None = field(default=None, metadata=_ROW)
    limit_group: str | None = field(default=None, metadata=_ROW)
    ordered_by: Callable[[Any], str | int] | None = field(default=None, metadata=_ROW)
    on_dead: str = field(default="skip", metadata=_ROW)

    def __post_init__(self) -> None:
        self._check_mode()
        for check in self._checks():
            check()
        if self.on_failure is not None and not callable(self.on_failure):
            raise TypeError(f"@receiver(on_failure=) must be callable, not {self.on_failure!r}.")
        if not isinstance(self.takes_context, bool):
            raise TypeError(
                f"@receiver(takes_context=) must be True or False, not {self.takes_context!r}."
            )

    @property
    def durable(self) -> bool:
        """Whether the receiver is owed a delivery row."""
        return self.mode is DURABLE

    @property
    def retry_policy(self) -> RetryPolicy | None:
        """The policy stored on the receiver: none when the backoff knobs are given, as
        they are read against the settings at each failure."""
        if self.backoff_base_seconds is not None or self.backoff_cap_seconds is not None:
            return None
        return self.retry

    def _checks(self) -> tuple[Callable[[], None], ...]:
        """The row options' checks, in the order their errors win; none unless durable
        (the mode check has refused any row option given to another mode)."""
        if not self.durable:
            return ()
        return (
            self._check_max_attempts,
            self._check_eager,
            self._check_site,
            self._check_lease_seconds,
            self._check_targets,
            self._check_retry,
            self._check_lane,
            self._check_lifetimes,
            self._check_ack,
            self._check_due,
            self._check_priority,
            self._check_limits,
            self._check_ordering,
        )

    def _check_mode(self) -> None:
        if not isinstance(self.mode, DeliveryMode):
            raise TypeError(
                f"@receiver(mode=) must be DURABLE, INLINE or ON_COMMIT, not {self.mode!r}."
            )
        if self.durable:
            return
        for option in dataclasses.fields(self):
            if option.metadata.get("row") and getattr(self, option.name) != option.default:
                raise ValueError(
                    f"@receiver({option.name}=...) describes a delivery row, and "
                    f"mode={self.mode.name} writes none. Drop it, or make the receiver DURABLE."
                )

    def _check_max_attempts(self) -> None:
        value = self.max_attempts
        if value is None:
            if self.ttl is None and self.give_up_after is None:
                raise ValueError(
                    "@receiver(max_attempts=None) would let a delivery be owed forever; "
                    "bound it with ttl= or give_up_after=, or give max_attempts a number."
                )
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"@receiver(max_attempts=) must be an int >= 1 or None, not {value!r}."
            )

    def _check_eager(self) -> None:
        if not isinstance(self.eager, bool):
            raise TypeError(f"@receiver(eager=) must be True or False, not {self.eager!r}.")

    def _check_site(self) -> None:
        if self.site not in ("relay", "task"):
            raise ValueError(f"@receiver(site=) must be 'relay' or 'task', not {self.site!r}.")

    def _check_lease_seconds(self) -> None:
        if self.lease_seconds is not None:
            _positive_seconds(self.lease_seconds, "lease_seconds")

    def _check_targets(self) -> None:
        if self.targets is not None:
            _sync_callable(self.targets, "targets")

    def _check_retry(self) -> None:
        base, cap, retry = self.backoff_base_seconds, self.backoff_cap_seconds, self.retry
        if retry is not None and (base is not None or cap is not None):
            raise ValueError(
                "@receiver(retry=) and backoff_base_seconds=/backoff_cap_seconds= both describe "
                "the wait between attempts; use retry=Exponential(base, cap) alone."
            )
        if base is not None:
            _positive_seconds(base, "backoff_base_seconds")
        if cap is not None:
            _positive_seconds(cap, "backoff_cap_seconds")
        if base is not None and cap is not None and cap < base:
            raise ValueError(
                f"@receiver(backoff_cap_seconds={cap!r}) is below backoff_base_seconds={base!r}; "
                "the cap must be at least the base."
            )
        if retry is not None and not callable(getattr(retry, "delay", None)):
            raise TypeError(
                f"@receiver(retry=) needs Exponential, Constant, Linear or an object with "
                f"delay(attempt, error) -> float | None, not {retry!r}."
            )

    def _check_lane(self) -> None:
        lane = self.lane
        if not isinstance(lane, str) or not lane.strip() or len(lane) > MAX_LANE_LENGTH:
            raise ValueError(
                f"@receiver(lane=) must be a non-empty string of at most {MAX_LANE_LENGTH} "
                f"chars, not {lane!r}."
            )

    def _check_lifetimes(self) -> None:
        if self.give_up_after is not None:
            _positive_timedelta(self.give_up_after, "give_up_after")
        if self.ttl is not None:
            _positive_timedelta(self.ttl, "ttl")

    def _check_ack(self) -> None:
        if self.ack not in ("each", "batch"):
            raise ValueError(
                f"@receiver(ack=) must be 'each' (one commit per delivery) or 'batch' (a run "
                f"of rows acknowledged in one commit: only for receivers that write nothing "
                f"but this database), not {self.ack!r}."
            )

    def _check_due(self) -> None:
        due = self.due
        if due is None:
            return
        if self.eager:
            raise ValueError(
                "@receiver(due=) with eager=True: an eager attempt runs at commit, and a "
                "scheduled delivery is not due then. Drop eager=True."
            )
        if self.targets is not None:
            raise ValueError(
                "@receiver(due=) with targets=: a fan-out resolved at fire time would keep "
                "that recipient set until the row came due. Declare the scheduled receiver "
                "without targets= and have it fire a follow-up event whose receiver declares "
                "targets=."
            )
        if isinstance(due, timedelta):
            if due <= timedelta(0):
                raise ValueError(
                    f"@receiver(due={due!r}): a delay that is not in the future is no "
                    "schedule; give a positive timedelta."
                )
            return
        if not callable(due):
            raise TypeError(
                f"@receiver(due=) takes a timedelta or a callable of the event returning an "
                f"aware datetime, not {due!r}."
            )
        _sync_callable(due, "due")

    def _check_priority(self) -> None:
        value = self.priority
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"@receiver(priority=) must be an int (higher runs first, default 0), "
                f"not {value!r}."
            )

    def _check_limits(self) -> None:
        if self.rate_limit is not None:
            per_second(self.rate_limit)
        value = self.concurrency_limit
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(
                f"@receiver(concurrency_limit=) must be an int >= 1 (at most that many rows "
                f"running at once, across every relay) or None, not {value!r}."
            )
        group = self.limit_group
        if group is not None and (
            not isinstance(group, str) or not group.strip() or len(group) > MAX_LANE_LENGTH
        ):
            raise ValueError(
                f"@receiver(limit_group=) must name a group of LIMIT_GROUPS (a non-empty "
                f"string of at most {MAX_LANE_LENGTH} chars) or be None, not {group!r}."
            )

    def _check_ordering(self) -> None:
        if self.ordered_by is not None:
            _sync_callable(self.ordered_by, "ordered_by")
        if self.on_dead not in ("skip", "block"):
            raise ValueError(
                f"@receiver(on_dead=) must be 'skip' (a dead row lets its key's later rows "
                f"run) or 'block' (it holds them until an operator acts), not {self.on_dead!r}."
            )
        if self.on_dead == "block" and self.ordered_by is None:
            raise ValueError(
                "@receiver(on_dead='block') holds a key's later rows behind a dead one, and "
                "this receiver has no key: add ordered_by=lambda evt: ..., or drop on_dead."
            )


_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def per_second(rate: object, *, where: str = "@receiver(rate_limit=)") -> float:
    """A ``rate_limit`` (``"50/s"``, ``"600/m"``, ``"1000/h"``) in deliveries per second.

    Raises ``ValueError`` naming ``where`` it was written, the value and the form it
    should take.
    """
    count, _, period = rate.partition("/") if isinstance(rate, str) else ("", "", "")
    if count.strip().isdigit() and int(count) > 0 and period.strip() in _PERIODS:
        return int(count) / _PERIODS[period.strip()]
    raise ValueError(
        f"{where} must be a count per second, minute or hour such as '50/s', "
        f"'600/m' or '1000/h', not {rate!r}."
    )
