"""The admin dashboard's column and indexes.

``error_type`` is a stored generated column (the database computes it from
``last_error``): adding it rewrites the deliveries table on PostgreSQL and MariaDB and
rebuilds it on SQLite, so on a large table run this migration in a quiet moment, after a
prune. The two partial indexes read dead letters by receiver and error type, and
settlements by time.
"""

import django.db.models.expressions
import django.db.models.lookups
from django.db import migrations, models

import django_domain_events.models


class Migration(migrations.Migration):
    dependencies = [
        ("django_domain_events", "0004_lane_pause_record"),
    ]

    operations = [
        migrations.AddField(
            model_name="deliveryrecord",
            name="error_type",
            field=models.GeneratedField(
                db_persist=True,
                expression=django_domain_events.models.TightSubstr(
                    models.Case(
                        models.When(
                            django.db.models.lookups.GreaterThan(
                                django_domain_events.models.TightStrIndex(
                                    "last_error", models.Value(":")
                                ),
                                0,
                            ),
                            then=django_domain_events.models.TightSubstr(
                                "last_error",
                                1,
                                django.db.models.expressions.CombinedExpression(
                                    django_domain_events.models.TightStrIndex(
                                        "last_error", models.Value(":")
                                    ),
                                    "-",
                                    models.Value(1),
                                ),
                            ),
                        ),
                        default=models.F("last_error"),
                        output_field=models.TextField(),
                    ),
                    1,
                    100,
                ),
                output_field=models.CharField(max_length=100),
            ),
        ),
        migrations.AddIndex(
            model_name="deliveryrecord",
            index=django_domain_events.models.PartialIndex(
                fallback=["status", "receiver_key", "error_type"],
                fields=["receiver_key", "error_type"],
                name="dde_delivery_dead_type",
                where=models.Q(("status__in", ["dead", "orphaned"])),
            ),
        ),
        migrations.AddIndex(
            model_name="deliveryrecord",
            index=django_domain_events.models.PartialIndex(
                covering=["status"],
                fallback=["completed_at", "status"],
                fields=["completed_at"],
                name="dde_delivery_completed",
                where=models.Q(("completed_at__isnull", False)),
            ),
        ),
    ]
