"""Order per key: each delivery row's ``order_key`` (``@receiver(ordered_by=)``, null for
every other row) and the two partial indexes the claim asks whether a row is its key's
head (``delivery/ordering.py``): the key's unended rows by id, and its claimed rows."""

from django.db import migrations, models
from django.db.models import Q

import django_domain_events.models


class Migration(migrations.Migration):
    dependencies = [
        ("django_domain_events", "0011_priority_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="deliveryrecord",
            name="order_key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddIndex(
            model_name="deliveryrecord",
            index=django_domain_events.models.PartialIndex(
                fields=["receiver_key", "order_key", "id"],
                name="dde_delivery_order",
                where=Q(
                    order_key__isnull=False, status__in=("pending", "failed", "claimed", "dead")
                ),
                fallback=["status", "receiver_key", "order_key", "id"],
            ),
        ),
        migrations.AddIndex(
            model_name="deliveryrecord",
            index=django_domain_events.models.PartialIndex(
                fields=["receiver_key", "order_key"],
                name="dde_delivery_order_claimed",
                where=Q(order_key__isnull=False, status="claimed"),
                fallback=["status", "receiver_key", "order_key"],
            ),
        ),
    ]
