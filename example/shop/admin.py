from django.contrib import admin

from .models import (
    Customer,
    DailySalesReport,
    Email,
    Invoice,
    LedgerEntry,
    Newsletter,
    Offer,
    Order,
    Shipment,
    StockCount,
)


@admin.register(Customer)
class CustomerAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "email"]


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["id", "customer", "total", "status", "placed_at"]
    list_filter = ["status"]


@admin.register(Shipment)
class ShipmentAdmin(admin.ModelAdmin):
    list_display = ["id", "order", "carrier", "dispatched", "tracking_code"]


@admin.register(LedgerEntry)
class LedgerEntryAdmin(admin.ModelAdmin):
    list_display = ["id", "order", "amount"]


@admin.register(Email)
class EmailAdmin(admin.ModelAdmin):
    list_display = ["id", "to", "subject", "sent_at"]


@admin.register(Offer)
class OfferAdmin(admin.ModelAdmin):
    list_display = ["id", "customer", "item", "expires_at", "accepted", "expired", "made_event_id"]
    list_filter = ["accepted", "expired"]


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    list_display = ["id", "customer", "amount", "paid"]
    list_filter = ["paid"]


@admin.register(Newsletter)
class NewsletterAdmin(admin.ModelAdmin):
    list_display = ["id", "subject", "send_at", "sent_at"]


@admin.register(StockCount)
class StockCountAdmin(admin.ModelAdmin):
    list_display = ["id", "warehouse", "sku", "quantity"]


@admin.register(DailySalesReport)
class DailySalesReportAdmin(admin.ModelAdmin):
    list_display = ["day", "orders", "paid", "cancelled", "sales", "written_at"]
