"""The Redis side of Celery: a fetch that cannot lose a message, one-trip publish, results."""
