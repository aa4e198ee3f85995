"""The example's URLs."""

from __future__ import annotations

from django.urls import path

from examples.django_outbox import views

urlpatterns = [path("orders", views.create_order)]
