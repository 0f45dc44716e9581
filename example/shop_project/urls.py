"""The admin shows the shop's rows beside the package's events and deliveries; /metrics
serves the outbox's figures to Prometheus."""

from django.contrib import admin
from django.urls import path

from django_domain_events.contrib.prometheus import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics_view),
]
