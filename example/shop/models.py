"""The shop's own tables. None of them knows about events: the receivers write them."""

from __future__ import annotations

from django.db import models


class Customer(models.Model):
    name = models.CharField(max_length=100)
    email = models.EmailField()

    def __str__(self) -> str:
        return self.name


class Order(models.Model):
    class Status(models.TextChoices):
        PLACED = "placed", "placed"
        PAID = "paid", "paid"
        CANCELLED = "cancelled", "cancelled"

    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="orders")
    total = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PLACED)

    def __str__(self) -> str:
        return f"Order #{self.pk} ({self.status})"


class Shipment(models.Model):
    """A parcel a warehouse booked for a paid order (written by the fan-out receiver)."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="shipments")
    carrier = models.CharField(max_length=100)

    def __str__(self) -> str:
        return f"Shipment of order #{self.order_id} by {self.carrier}"


class LedgerEntry(models.Model):
    """Money owed to the shop: plus when an order is placed, minus when it is cancelled."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="ledger_entries")
    amount = models.DecimalField(max_digits=10, decimal_places=2)

    class Meta:
        verbose_name_plural = "ledger entries"

    def __str__(self) -> str:
        return f"{self.amount} on order #{self.order_id}"


class Email(models.Model):
    """Stands in for a mail server: every "sent" mail is a row, so its effect is visible."""

    to = models.EmailField()
    subject = models.CharField(max_length=200)
    sent_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"To {self.to}: {self.subject}"
