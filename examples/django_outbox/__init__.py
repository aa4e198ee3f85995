"""A Django checkout view that enqueues the receipt through the outbox (a tested example).

Run it with ``DJANGO_SETTINGS_MODULE=examples.django_outbox.settings``: ``migrate`` creates
the outbox table (``conventions.contrib.django_outbox``); the orders table is the reference
shop's (``python -m tasks.shop init``), mapped by an unmanaged model.
"""
