"""Models the tests' receivers write to, so outcomes are read back from real rows."""

from django.db import models


class Order(models.Model):
    number = models.CharField(max_length=32)
    total = models.IntegerField(default=0)


class Delivered(models.Model):
    """One row per delivery a receiver ran; the unique id proves nothing ran twice."""

    delivery_id = models.BigIntegerField(null=True, unique=True)
    receiver_key = models.CharField(max_length=255)
    event_id = models.BigIntegerField()
    target = models.CharField(max_length=255, blank=True, default="")
    note = models.CharField(max_length=255, blank=True, default="")


class RunLog(models.Model):
    """One row per receiver run that committed, with no unique constraint, so a delivery that
    ran twice shows up as two rows (tests/test_lifecycle_machine.py)."""

    delivery_id = models.BigIntegerField(db_index=True)
    receiver_key = models.CharField(max_length=255)
    attempt = models.PositiveIntegerField()
