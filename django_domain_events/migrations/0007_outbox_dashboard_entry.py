"""The dashboard's entry on the admin index: a proxy model, which has no table."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_domain_events", "0006_event_trace_context"),
    ]

    operations = [
        migrations.CreateModel(
            name="OutboxDashboard",
            fields=[],
            options={
                "verbose_name": "outbox dashboard",
                "verbose_name_plural": "outbox dashboard",
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("django_domain_events.deliveryrecord",),
        ),
    ]
