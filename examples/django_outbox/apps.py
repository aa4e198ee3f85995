"""The example's Django app."""

from __future__ import annotations

from django.apps import AppConfig


class CheckoutConfig(AppConfig):
    name = "examples.django_outbox"
    label = "checkout"
    default_auto_field = "django.db.models.BigAutoField"
