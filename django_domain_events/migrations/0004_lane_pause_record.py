"""The lane pause model is ``LanePauseRecord`` (its table unchanged), so that
``LanePause`` names one thing: the value ``outbox_health()`` reports."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_domain_events", "0003_claim_position")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RenameModel("LanePause", "LanePauseRecord"),
                migrations.AlterModelTable("LanePauseRecord", "django_domain_events_lanepause"),
            ]
        )
    ]
