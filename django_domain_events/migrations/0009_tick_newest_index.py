"""An index for ``schedule_status()``: each schedule's newest fired, skipped and failed
tick in one index descent each, so ``outbox_health()`` and ``manage.py schedules`` cost
the same however many tick rows the schedules have kept."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_domain_events", "0008_recurring_schedules"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="tickrecord",
            index=models.Index(fields=["schedule_key", "status", "tick"], name="dde_tick_newest"),
        ),
    ]
