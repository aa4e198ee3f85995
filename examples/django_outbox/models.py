"""The shop's orders table, seen from Django (created by ``tasks.shop``: unmanaged)."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    id = models.CharField(max_length=32, primary_key=True)
    customer_id = models.CharField(max_length=32)
    amount_minor = models.IntegerField()
    currency = models.CharField(max_length=3)
    status = models.CharField(max_length=16)
    paid_minor = models.IntegerField()
    created_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "orders"

    def __str__(self) -> str:
        return self.id
