"""``POST /orders``: create the order and add its receipt job in one atomic block."""

from __future__ import annotations

import json

from django.db import IntegrityError, transaction
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_POST

from conventions import bind
from conventions.contrib import django_outbox
from examples.django_outbox.models import Order
from tasks.receipts import send_receipt


@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    """The order and its receipt job commit together, or neither does."""
    data = json.loads(request.body)
    with bind(request_id=request.headers.get("X-Request-ID")):
        try:
            with transaction.atomic():
                order = Order.objects.create(
                    id=data["order_id"],
                    customer_id=data["customer_id"],
                    amount_minor=data["amount_minor"],
                    currency="EUR",
                    status="paid",
                    paid_minor=data["amount_minor"],
                    created_at=timezone.now(),
                )
                job = django_outbox.add(send_receipt, order_id=order.id)
        except IntegrityError:  # a known order id, an unknown customer: nothing is kept
            return JsonResponse({"error": "order exists or customer unknown"}, status=409)
    return JsonResponse({"order_id": order.id, "receipt_job": job}, status=201)
