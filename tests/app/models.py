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
