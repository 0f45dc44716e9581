"""Billing's own table, written by its receiver."""

from django.db import models


class Invoice(models.Model):
    order_id = models.IntegerField(unique=True)
    total_cents = models.IntegerField()

    def __str__(self) -> str:
        return f"invoice for order {self.order_id}"
