from django.db import migrations, models, router

from django_domain_events.tally import rebuild


def count_scheduled_rows(apps, schema_editor):
    """Tally the rows already scheduled for later, so health counts them from the start."""
    alias = schema_editor.connection.alias
    delivery = apps.get_model("django_domain_events", "DeliveryRecord")
    if router.allow_migrate_model(alias, delivery):
        rebuild(alias, delivery, apps.get_model("django_domain_events", "ScheduledTally"))


class Migration(migrations.Migration):
    dependencies = [
        ("django_domain_events", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="ScheduledTally",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("receiver_key", models.CharField(max_length=255)),
                ("due_hour", models.DateTimeField()),
                ("rows", models.IntegerField()),
            ],
            options={
                "verbose_name": "scheduled tally",
                "verbose_name_plural": "scheduled tallies",
                "indexes": [
                    models.Index(fields=["due_hour", "receiver_key", "rows"], name="dde_tally_hour")
                ],
            },
        ),
        migrations.RunPython(count_scheduled_rows, migrations.RunPython.noop),
    ]
