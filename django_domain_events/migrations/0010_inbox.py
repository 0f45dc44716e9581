"""The inbox: dead inbox entries (consumed messages kept raw with their reason) and the
message a consumed event was recorded from."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_domain_events", "0009_tick_newest_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="DeadMessage",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("key", models.CharField(max_length=255, unique=True)),
                ("subscription", models.CharField(max_length=255)),
                ("broker", models.CharField(max_length=255)),
                ("source", models.CharField(blank=True, default="", max_length=255)),
                ("message_id", models.CharField(blank=True, default="", max_length=255)),
                ("type", models.CharField(blank=True, default="", max_length=255)),
                ("headers", models.JSONField(blank=True, default=dict)),
                ("attributes", models.JSONField(blank=True, default=dict)),
                ("body", models.BinaryField()),
                ("reason", models.TextField()),
                ("received_at", models.DateTimeField(db_index=True)),
                ("retried_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "dead inbox entry",
                "verbose_name_plural": "dead inbox entries",
            },
        ),
        migrations.AddField(
            model_name="eventrecord",
            name="received",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
