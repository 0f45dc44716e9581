"""The shop's own tables. None of them knows about events: the receivers write them."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


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
    placed_at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return f"Order #{self.pk} ({self.status})"


class Shipment(models.Model):
    """A parcel a warehouse booked for a paid order (written by the fan-out receiver)."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="shipments")
    carrier = models.CharField(max_length=100)
    dispatched = models.BooleanField(default=False)
    tracking_code = models.CharField(max_length=50, blank=True)

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


class Offer(models.Model):
    """A waitlist offer: the customer may have the item if they accept before ``expires_at``.

    ``made_event_id`` is what ``fire(OfferMade(...))`` returned: accepting the offer
    cancels that event's pending expiry by it.
    """

    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="offers")
    item = models.CharField(max_length=100)
    expires_at = models.DateTimeField()
    accepted = models.BooleanField(default=False)
    expired = models.BooleanField(default=False)
    made_event_id = models.PositiveBigIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        state = "accepted" if self.accepted else "expired" if self.expired else "open"
        return f"Offer #{self.pk} of {self.item} to {self.customer} ({state})"

    def expire(self) -> None:
        self.expired = True
        self.save(update_fields=["expired"])


class Invoice(models.Model):
    """Money a customer on account owes; a reminder goes out a fortnight after issue."""

    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="invoices")
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    paid = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"Invoice #{self.pk} ({self.amount}, {'paid' if self.paid else 'unpaid'})"


class Newsletter(models.Model):
    """A mailing to every customer, sent at ``send_at`` by a scheduled receiver."""

    subject = models.CharField(max_length=200)
    send_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.subject


class StockCount(models.Model):
    """A warehouse's count of one item; the marketplace wants it while it is fresh."""

    warehouse = models.CharField(max_length=100)
    sku = models.CharField(max_length=50)
    quantity = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"{self.quantity} x {self.sku} in {self.warehouse}"


class DailySalesReport(models.Model):
    """One day's sales, in the shop's time zone (Europe/Paris): written each night by
    ``shop.write_sales_report`` for the day before."""

    day = models.DateField(unique=True)
    orders = models.PositiveIntegerField()
    paid = models.PositiveIntegerField()
    cancelled = models.PositiveIntegerField()
    sales = models.DecimalField(max_digits=12, decimal_places=2)  # the orders not cancelled
    written_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"Sales of {self.day}: {self.orders} orders, {self.sales}"
