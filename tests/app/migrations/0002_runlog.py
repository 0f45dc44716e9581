from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("testapp", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="RunLog",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("delivery_id", models.BigIntegerField(db_index=True)),
                ("receiver_key", models.CharField(max_length=255)),
                ("attempt", models.PositiveIntegerField()),
            ],
        ),
    ]
