"""Django integration of the outbox: a model of ``cc_outbox`` and a transaction-aware add.

Add ``"conventions.contrib.django_outbox"`` to ``INSTALLED_APPS`` and run ``migrate`` (it
creates the same table ``conventions.transactional.outbox`` defines; a table made by
``conventions outbox init`` is taken as it is with ``migrate --fake-initial``).
``USE_TZ`` must be on (Django's default). Then, in a view::

    with transaction.atomic():
        order = Order.objects.create(...)
        django_outbox.add(send_receipt, order_id=order.id)

The row is written on the atomic block's connection and commits or rolls back with the
order; ``conventions outbox relay`` publishes it. Django is not a dependency of the
layer: this package is imported only by Django projects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conventions.errors import ConfigurationError
from conventions.transactional import outbox

if TYPE_CHECKING:
    from conventions.task import ConventionTask


def add(task: ConventionTask, /, **payload: Any) -> str:
    """Add a job to the outbox inside the current ``transaction.atomic()`` block; return
    its task id. Checked like ``task.delay(**payload)``: a bad call raises
    ``PayloadError`` and writes nothing."""
    return add_call(task, payload)


def add_call(
    task: ConventionTask,
    kwargs: dict[str, Any],
    *,
    using: str | None = None,
    idempotency_key: str | None = None,
    headers: dict[str, Any] | None = None,
) -> str:
    """``add`` with options: the database alias (default: the router's choice for the
    outbox model), an explicit idempotency key, extra headers.

    Outside an atomic block the row would commit on its own, apart from the data it is
    about: that is refused with ``ConfigurationError``.
    """
    from django.db import router, transaction

    from conventions.contrib.django_outbox.models import OutboxMessage

    alias = using or router.db_for_write(OutboxMessage)
    if not transaction.get_connection(alias).in_atomic_block:
        raise ConfigurationError(
            f"{task.name}: django_outbox.add must run inside transaction.atomic() with the "
            "data the job is about (or set ATOMIC_REQUESTS): alone it would commit apart"
        )
    row = outbox.row_for(task, kwargs, idempotency_key=idempotency_key, headers=headers)
    OutboxMessage.objects.using(alias).create(**row)
    return str(row["task_id"])
