"""The Django app config of the outbox integration."""

from __future__ import annotations

from django.apps import AppConfig


class OutboxConfig(AppConfig):  # type: ignore[misc]
    name = "conventions.contrib.django_outbox"
    label = "django_outbox"
    verbose_name = "Transactional outbox"
    default_auto_field = "django.db.models.BigAutoField"
