"""The admin shows the shop's rows beside the package's events and deliveries."""

from django.contrib import admin
from django.urls import path

urlpatterns = [
    path("admin/", admin.site.urls),
]
