"""The trace context an event was fired in, for a tracing integration (empty otherwise)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_domain_events", "0005_error_type_and_dashboard_indexes")]

    operations = [
        migrations.AddField(
            model_name="eventrecord",
            name="trace_context",
            field=models.CharField(blank=True, default="", max_length=512),
        ),
    ]
