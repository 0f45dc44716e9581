"""The two tables, the event log and the deliveries owed for it, and their small helpers.

A delivery row's ``available_at`` is the earliest moment any relay may claim it, for
every status that is owed: a pending or failed row's next attempt, and a claimed row's
lease expiry. One partial index over owed rows ordered by ``available_at`` therefore
serves every claim, including the takeover of a lapsed lease, and never reads settled
history.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models, router
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import StrIndex, Substr
from django.db.models.lookups import GreaterThan

from .priority import rank


class DeliveryStatus(models.TextChoices):
    """Where a delivery row stands. Terminal: succeeded, dead, orphaned, cancelled."""

    PENDING = "pending", "pending"
    CLAIMED = "claimed", "claimed"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    DEAD = "dead", "dead"
    ORPHANED = "orphaned", "orphaned"
    CANCELLED = "cancelled", "cancelled"


OWED = (DeliveryStatus.PENDING, DeliveryStatus.FAILED, DeliveryStatus.CLAIMED)
TERMINAL = (
    DeliveryStatus.SUCCEEDED,
    DeliveryStatus.DEAD,
    DeliveryStatus.ORPHANED,
    DeliveryStatus.CANCELLED,
)
OWED_VALUES = tuple(s.value for s in OWED)
TERMINAL_VALUES = tuple(s.value for s in TERMINAL)

# The statuses as SQL literals, for the hand-written statements (``{claimed}``,
# ``{owed}``): literals, not parameters, so PostgreSQL matches the partial indexes.
STATUS_SQL = {s.name.lower(): f"'{s.value}'" for s in DeliveryStatus}
STATUS_SQL["owed"] = "(" + ", ".join(f"'{v}'" for v in OWED_VALUES) + ")"


class TightStrIndex(StrIndex):
    """``StrIndex`` written without spaces, for a generated column (migration 0005)."""

    # No ", " inside a generated column's SQL: Django's SQLite introspection splits the
    # table's definition on it, and would fail on every later migration of the table.
    arg_joiner = ","


class TightSubstr(Substr):
    """``Substr`` written without spaces, for a generated column (migration 0005)."""

    arg_joiner = ","


#: The longest ordering key (``@receiver(ordered_by=)``) a row stores.
ORDER_KEY_LENGTH = 200

# The statuses that hold an ordered key's later rows: owed, and dead (under on_dead="block").
UNENDED_VALUES = (*OWED_VALUES, DeliveryStatus.DEAD.value)

#: The longest ``error_type`` kept: a class name, or the start of a message without one.
ERROR_TYPE_CHARS = 100


class PartialIndex(models.Index):
    """An index over some rows only, where the database has partial indexes.

    PostgreSQL and SQLite get ``fields`` restricted by ``where`` (and, on PostgreSQL, the
    ``covering`` columns included). MariaDB and MySQL have no partial indexes: they get
    the ``fallback`` columns, led by ``status``, so a range on status still skips settled
    history. Declared this way rather than with ``condition=``, which those databases
    would silently ignore, leaving an index over the whole history.
    """

    def __init__(
        self,
        *,
        fields: Sequence[str],
        name: str,
        where: Q,
        fallback: Sequence[str],
        covering: Sequence[str] = (),
    ) -> None:
        super().__init__(fields=list(fields), name=name)
        self.where = where
        self.fallback = list(fallback)
        self.covering = list(covering)

    def deconstruct(self) -> Any:
        path, args, kwargs = super().deconstruct()
        kwargs.update(where=self.where, fallback=self.fallback)
        if self.covering:
            kwargs["covering"] = self.covering
        return "django_domain_events.models.PartialIndex", args, kwargs

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        features = schema_editor.connection.features
        if features.supports_partial_indexes:
            include = self.covering if features.supports_covering_indexes else []
            index = models.Index(
                fields=self.fields, name=self.name, condition=self.where, include=include
            )
        else:
            index = models.Index(fields=self.fallback, name=self.name)
        return index.create_sql(model, schema_editor, using=using, **kwargs)


class EventRecord(models.Model):
    """One fired event: what happened, when, on whose behalf, and why."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=255, db_index=True)
    version = models.PositiveIntegerField(default=1)
    payload = models.JSONField(default=dict)
    occurred_at = models.DateTimeField()
    recorded_at = models.DateTimeField(db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    actor_key = models.CharField(max_length=255, blank=True, default="")
    actor_label = models.CharField(max_length=255, blank=True, default="")
    scope = models.JSONField(default=dict, blank=True)
    correlation_id = models.CharField(max_length=255, blank=True, default="", db_index=True)
    # The W3C trace context fire() was called in, when a tracing integration is installed.
    trace_context = models.CharField(max_length=512, blank=True, default="")
    causation_id = models.BigIntegerField(null=True, blank=True)
    # NULL, not "": rows without a key must not collide in the unique constraint.
    dedupe_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    suppressed_reason = models.CharField(max_length=255, blank=True, default="")
    retention_seconds = models.BigIntegerField(null=True, blank=True)
    delete_when = models.CharField(max_length=16, blank=True, default="")
    # recorded_at + retention_seconds, so the prune compares one column on every database.
    prune_after = models.DateTimeField(null=True, blank=True, db_index=True)
    # A consumed event's message (inbox.py): its CloudEvents source, id, type, causation
    # and subscription as the other service sent them; null for an event fired here.
    received = models.JSONField(null=True, blank=True)

    class Meta:
        verbose_name = "event"
        constraints = [
            models.UniqueConstraint(fields=["name", "dedupe_key"], name="dde_event_dedupe"),
        ]

    def __str__(self) -> str:
        return f"{self.name} #{self.pk}"


class DeliveryQuerySet(models.QuerySet["DeliveryRecord"]):
    """Delivery rows; an ``update`` that moves ``available_at`` moves ``claim_rank`` with it."""

    def update(self, **kwargs: Any) -> int:
        moment = kwargs.get("available_at")
        if isinstance(moment, datetime):
            kwargs["claim_rank"] = Value(rank(moment)) - F("priority_credit")
        return super().update(**kwargs)


class DeliveryRecord(models.Model):
    """One receiver's (or one target's) delivery of one event, with its attempts."""

    id = models.BigAutoField(primary_key=True)
    event = models.ForeignKey(
        EventRecord, on_delete=models.CASCADE, related_name="deliveries", db_index=False
    )
    receiver_key = models.CharField(max_length=255)
    target = models.CharField(max_length=255, blank=True, default="")
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(null=True, blank=True)
    available_at = models.DateTimeField()
    # The claim's order: available_at in microseconds since the epoch, less the credit
    # the receiver's priority earned at fire (priority.py). Follows every write of
    # available_at (DeliveryQuerySet.update); 0, first in line, on a row written without.
    claim_rank = models.BigIntegerField(default=0, db_default=0)
    priority_credit = models.BigIntegerField(default=0, db_default=0)
    due_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=255, blank=True, default="")
    claimed_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The row's place (1, 2, ...) in the batch its worker runs in order; 0 when its worker
    # took it alone (a task). A takeover charges an attempt only to the row that was running.
    claim_position = models.PositiveIntegerField(default=0, db_default=0)
    last_error = models.TextField(blank=True, default="")
    # An ordered receiver's key (str of ordered_by(evt)); null for every other row.
    order_key = models.CharField(max_length=ORDER_KEY_LENGTH, null=True, blank=True)  # noqa: DJ001
    completed_at = models.DateTimeField(null=True, blank=True)
    succeeded_at = models.DateTimeField(null=True, blank=True)
    # ``last_error`` up to its first ':' (``ValueError``, ``expired``): what the dashboard
    # groups dead letters by. Computed by the database on every write, so no writer
    # maintains it, and read from the dde_delivery_dead_type index, not the error texts.
    error_type = models.GeneratedField(
        expression=TightSubstr(
            Case(
                When(
                    GreaterThan(TightStrIndex("last_error", Value(":")), 0),
                    then=TightSubstr("last_error", 1, TightStrIndex("last_error", Value(":")) - 1),
                ),
                default=F("last_error"),
                output_field=models.TextField(),
            ),
            1,
            ERROR_TYPE_CHARS,
        ),
        output_field=models.CharField(max_length=ERROR_TYPE_CHARS),
        db_persist=True,
    )

    objects = DeliveryQuerySet.as_manager()

    class Meta:
        verbose_name = "delivery"
        verbose_name_plural = "deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["event", "receiver_key", "target"], name="dde_delivery_unique"
            ),
        ]
        indexes = [
            # The claim: owed rows in claim order (priority.py). Partial, so settled
            # history costs nothing.
            PartialIndex(
                fields=["claim_rank", "id"],
                name="dde_delivery_claim_rank",
                where=Q(status__in=OWED_VALUES),
                fallback=["status", "claim_rank", "id"],
            ),
            # One receiver's owed rows in claim order: the claim of a limited receiver.
            PartialIndex(
                fields=["receiver_key", "claim_rank", "id"],
                name="dde_delivery_key_rank",
                where=Q(status__in=OWED_VALUES),
                fallback=["status", "receiver_key", "claim_rank", "id"],
            ),
            # Health: the work due now, read without touching the table (PostgreSQL).
            PartialIndex(
                fields=["due_at"],
                name="dde_delivery_due",
                where=Q(status__in=OWED_VALUES),
                fallback=["status", "due_at"],
                covering=["receiver_key", "status", "available_at", "expires_at"],
            ),
            # Health: scheduled (and owed) rows counted per receiver.
            PartialIndex(
                fields=["receiver_key", "status", "due_at"],
                name="dde_delivery_owed",
                where=Q(status__in=OWED_VALUES),
                fallback=["status", "receiver_key", "due_at"],
            ),
            # Dead letters per receiver, oldest first: health, dump, purge, their lifetime.
            PartialIndex(
                fields=["receiver_key", "completed_at"],
                name="dde_delivery_dead",
                where=Q(status=DeliveryStatus.DEAD),
                fallback=["status", "receiver_key", "completed_at"],
            ),
            # A worker's claim in run order: which of a dead worker's rows was running.
            PartialIndex(
                fields=["claimed_by", "claimed_at", "claim_position"],
                name="dde_delivery_held",
                where=Q(status=DeliveryStatus.CLAIMED),
                fallback=["status", "claimed_by", "claimed_at", "claim_position"],
            ),
            # Rows with a lifetime, by its end: the relay's sweep of expired rows.
            PartialIndex(
                fields=["expires_at"],
                name="dde_delivery_expiry",
                where=Q(status__in=OWED_VALUES, expires_at__isnull=False),
                fallback=["status", "expires_at"],
            ),
            # Dead and orphaned rows per receiver and error type: the dashboard's dead
            # letters without reading their texts, and the admin's receiver filter.
            PartialIndex(
                fields=["receiver_key", "error_type"],
                name="dde_delivery_dead_type",
                where=Q(status__in=[DeliveryStatus.DEAD, DeliveryStatus.ORPHANED]),
                fallback=["status", "receiver_key", "error_type"],
            ),
            # Settlements by time: the dashboard's last hour, succeeded and dead per minute.
            PartialIndex(
                fields=["completed_at"],
                name="dde_delivery_completed",
                where=Q(completed_at__isnull=False),
                fallback=["completed_at", "status"],
                covering=["status"],
            ),
            # An ordered key's unended rows in firing order: is a row its key's head?
            PartialIndex(
                fields=["receiver_key", "order_key", "id"],
                name="dde_delivery_order",
                where=Q(order_key__isnull=False, status__in=UNENDED_VALUES),
                fallback=["status", "receiver_key", "order_key", "id"],
            ),
            # An ordered key's claimed rows: is another row of the key running?
            PartialIndex(
                fields=["receiver_key", "order_key"],
                name="dde_delivery_order_claimed",
                where=Q(order_key__isnull=False, status=DeliveryStatus.CLAIMED),
                fallback=["status", "receiver_key", "order_key"],
            ),
            # Each receiver's newest success, for quiet_receivers(); kept through a replay.
            PartialIndex(
                fields=["receiver_key", "succeeded_at"],
                name="dde_delivery_success",
                where=Q(succeeded_at__isnull=False),
                fallback=["receiver_key", "succeeded_at"],
            ),
        ]

    def __str__(self) -> str:
        target = f" -> {self.target}" if self.target else ""
        return f"{self.receiver_key}{target} ({self.status})"


class ScheduledTally(models.Model):
    """How many owed rows of one receiver fall due in one later hour: a delta or a sum.

    ``outbox_health()`` reads these instead of counting every row scheduled for later;
    ``tally.py`` writes and merges them.
    """

    id = models.BigAutoField(primary_key=True)
    receiver_key = models.CharField(max_length=255)
    due_hour = models.DateTimeField()
    rows = models.IntegerField()

    class Meta:
        verbose_name = "scheduled tally"
        verbose_name_plural = "scheduled tallies"
        indexes = [
            models.Index(fields=["due_hour", "receiver_key", "rows"], name="dde_tally_hour"),
        ]

    def __str__(self) -> str:
        return f"{self.receiver_key} due {self.due_hour.isoformat()}: {self.rows:+d}"


class ReceiverMark(models.Model):
    """A receiver's newest success, kept when the prune deletes the rows that showed it."""

    receiver_key = models.CharField(max_length=255, primary_key=True)
    last_succeeded_at = models.DateTimeField()

    class Meta:
        verbose_name = "receiver mark"

    def __str__(self) -> str:
        return f"{self.receiver_key} last succeeded {self.last_succeeded_at.isoformat()}"


class LanePauseRecord(models.Model):
    """A relay holding back a lane after ``RetryAfter(counts=False)``: for operators.

    ``outbox_health()`` reports the live ones as ``introspect.LanePause`` values.
    """

    id = models.BigAutoField(primary_key=True)
    lane = models.CharField(max_length=64)
    worker_id = models.CharField(max_length=255)
    paused_at = models.DateTimeField()
    until = models.DateTimeField(db_index=True)

    class Meta:
        db_table = "django_domain_events_lanepause"
        verbose_name = "lane pause"
        constraints = [
            models.UniqueConstraint(fields=["lane", "worker_id"], name="dde_lane_pause_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.lane} paused by {self.worker_id} until {self.until.isoformat()}"


class LimitRecord(models.Model):
    """A limited receiver's shared state: its rate's token bucket and its pause.

    Every relay's claim locks it, refills and spends its tokens (``delivery/limits.py``).
    How many of its rows run now is not stored: it is counted from the rows under a live
    lease, so a relay killed while running some frees them when their lease lapses.
    """

    key = models.CharField(max_length=255, primary_key=True)  # the receiver's key
    tokens = models.FloatField(default=0.0)
    refilled_at = models.DateTimeField()
    # Set when the receiver raised RetryAfter: no relay claims its rows before then.
    paused_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "django_domain_events_limit"
        verbose_name = "limit"

    def __str__(self) -> str:
        return self.key


class TickStatus(models.TextChoices):
    """What became of a schedule's tick."""

    FIRED = "fired", "fired"
    SKIPPED = "skipped", "skipped"
    FAILED = "failed", "failed"


class ScheduleRecord(models.Model):
    """A ``@recurring`` schedule's cursor: the newest tick handled and the next one due.

    Each relay pass reads the earliest ``next_tick_at`` (one indexed query); the relay
    that moves the cursor forward, by compare-and-set, fires the ticks in between.
    ``next_tick_at`` is NULL while the schedule is paused.
    """

    key = models.CharField(max_length=255, primary_key=True)
    spec = models.CharField(max_length=255)
    next_tick_at = models.DateTimeField(null=True, blank=True, db_index=True)
    last_tick_at = models.DateTimeField(null=True, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        verbose_name = "schedule"

    def __str__(self) -> str:
        return self.key


class TickRecord(models.Model):
    """One tick of a schedule, fired, failed or skipped; unique per (schedule, tick), so a
    tick fires once whichever relay reaches it and whatever crashes in between.

    A skipped row may stand for a run of ticks: ``skipped_from`` is the first of them
    and ``tick`` the last.
    """

    id = models.BigAutoField(primary_key=True)
    schedule_key = models.CharField(max_length=255)
    tick = models.DateTimeField()
    status = models.CharField(max_length=16, choices=TickStatus.choices)
    event = models.ForeignKey(
        EventRecord, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    skipped_from = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    recorded_at = models.DateTimeField(db_index=True)

    class Meta:
        verbose_name = "tick"
        constraints = [
            models.UniqueConstraint(fields=["schedule_key", "tick"], name="dde_tick_once"),
        ]
        indexes = [
            # schedule_status(): a schedule's newest fired, skipped and failed tick, each
            # one index descent, however many ticks it has (a tick writes a row a minute
            # at most, so the index costs nothing to keep).
            models.Index(fields=["schedule_key", "status", "tick"], name="dde_tick_newest"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_key} at {self.tick.isoformat()}: {self.status}"


class DeadMessage(models.Model):
    """A consumed message the inbox could not record as an event, kept raw with its reason.

    Acknowledged at the broker, so it never blocks the queue; ``inbox.retry_dead_messages``
    records it as an event once a deploy declares its type. ``key`` is the message's inbox
    key (its source and id), or a digest of its bytes when it has neither, so a message
    redelivered before its acknowledgement reached the broker is kept once.
    """

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(max_length=255, unique=True)
    subscription = models.CharField(max_length=255)
    broker = models.CharField(max_length=255)
    source = models.CharField(max_length=255, blank=True, default="")
    message_id = models.CharField(max_length=255, blank=True, default="")
    type = models.CharField(max_length=255, blank=True, default="")
    # The transport's headers as received (names and values as text) and the body, raw;
    # the CloudEvents attributes read from them, which a retry reads the message with.
    headers = models.JSONField(default=dict, blank=True)
    attributes = models.JSONField(default=dict, blank=True)
    body = models.BinaryField()
    reason = models.TextField()
    received_at = models.DateTimeField(db_index=True)
    retried_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "dead inbox entry"
        verbose_name_plural = "dead inbox entries"

    def __str__(self) -> str:
        return f"{self.type or '(no type)'} from {self.source or '(no source)'}: {self.reason}"


class OutboxDashboard(DeliveryRecord):
    """No table: the admin index's entry for the outbox dashboard (``admin/dashboard.py``), since
    Django lists models there and nothing else."""

    class Meta:
        proxy = True
        verbose_name = "outbox dashboard"
        verbose_name_plural = "outbox dashboard"
        default_permissions = ()


def database_alias() -> str:
    """The database every transaction of the package uses: the router's choice for the
    delivery rows (events and the tally live beside them, joined by foreign key)."""
    return router.db_for_write(DeliveryRecord)
