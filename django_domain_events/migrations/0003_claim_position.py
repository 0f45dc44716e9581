from django.db import migrations, models

import django_domain_events.models


class Migration(migrations.Migration):
    dependencies = [
        ("django_domain_events", "0002_scheduled_tally"),
    ]

    operations = [
        migrations.AddField(
            model_name="deliveryrecord",
            name="claim_position",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddIndex(
            model_name="deliveryrecord",
            index=django_domain_events.models.PartialIndex(
                fallback=["status", "claimed_by", "claimed_at", "claim_position"],
                fields=["claimed_by", "claimed_at", "claim_position"],
                name="dde_delivery_held",
                where=models.Q(("status", "claimed")),
            ),
        ),
    ]
