from django.contrib import admin

from .models import Customer, Email, LedgerEntry, Order, Shipment


@admin.register(Customer)
class CustomerAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "email"]


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["id", "customer", "total", "status"]
    list_filter = ["status"]


@admin.register(Shipment)
class ShipmentAdmin(admin.ModelAdmin):
    list_display = ["id", "order", "carrier"]


@admin.register(LedgerEntry)
class LedgerEntryAdmin(admin.ModelAdmin):
    list_display = ["id", "order", "amount"]


@admin.register(Email)
class EmailAdmin(admin.ModelAdmin):
    list_display = ["id", "to", "subject", "sent_at"]
