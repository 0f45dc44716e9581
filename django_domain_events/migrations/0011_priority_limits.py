"""Priorities: each delivery row's ``claim_rank`` (its ``available_at`` in microseconds,
less its priority's credit) and ``priority_credit``, and the claim's index on
``(claim_rank, id)`` in place of ``(available_at, id)``; limits: the ``LimitRecord``
table (a limited receiver's token bucket and pause). Owed rows get their rank from
their ``available_at`` (priority 0); settled rows keep 0, which no claim reads."""

from django.db import migrations, models
from django.db.models import Q

import django_domain_events.models


def rank_owed_rows(apps, schema_editor):
    from django_domain_events.models import OWED_VALUES
    from django_domain_events.priority import rank

    delivery = apps.get_model("django_domain_events", "DeliveryRecord")
    alias = schema_editor.connection.alias
    owed = delivery.objects.using(alias).filter(status__in=OWED_VALUES).order_by("pk")
    after = 0
    while True:
        rows = list(owed.filter(pk__gt=after).only("pk", "available_at")[:2000])
        if not rows:
            return
        for row in rows:
            row.claim_rank = rank(row.available_at)
        delivery.objects.using(alias).bulk_update(rows, ["claim_rank"])
        after = rows[-1].pk


class Migration(migrations.Migration):
    dependencies = [
        ("django_domain_events", "0010_inbox"),
    ]

    operations = [
        migrations.AddField(
            model_name="deliveryrecord",
            name="claim_rank",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="deliveryrecord",
            name="priority_credit",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.RunPython(rank_owed_rows, migrations.RunPython.noop),
        migrations.CreateModel(
            name="LimitRecord",
            fields=[
                ("key", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("tokens", models.FloatField(default=0.0)),
                ("refilled_at", models.DateTimeField()),
                ("paused_until", models.DateTimeField(blank=True, null=True)),
            ],
            options={"verbose_name": "limit", "db_table": "django_domain_events_limit"},
        ),
        migrations.RemoveIndex(model_name="deliveryrecord", name="dde_delivery_claim"),
        migrations.AddIndex(
            model_name="deliveryrecord",
            index=django_domain_events.models.PartialIndex(
                fields=["claim_rank", "id"],
                name="dde_delivery_claim_rank",
                where=Q(status__in=("pending", "failed", "claimed")),
                fallback=["status", "claim_rank", "id"],
            ),
        ),
        migrations.AddIndex(
            model_name="deliveryrecord",
            index=django_domain_events.models.PartialIndex(
                fields=["receiver_key", "claim_rank", "id"],
                name="dde_delivery_key_rank",
                where=Q(status__in=("pending", "failed", "claimed")),
                fallback=["status", "receiver_key", "claim_rank", "id"],
            ),
        ),
    ]
