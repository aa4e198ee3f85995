"""Settings of the Django example: the shop's PostgreSQL database from ``DATABASE_URL``."""

from __future__ import annotations

import os

from sqlalchemy.engine import make_url

_db = make_url(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/shop"))

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
ROOT_URLCONF = "examples.django_outbox.urls"
INSTALLED_APPS = ["conventions.contrib.django_outbox", "examples.django_outbox.apps.CheckoutConfig"]
#: one correlation context per request: the outbox rows (and their jobs) carry it
MIDDLEWARE = ["conventions.contrib.web.DjangoMiddleware"]
USE_TZ = True
TIME_ZONE = "UTC"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.database,
        "USER": _db.username or "",
        "PASSWORD": _db.password or "",
        "HOST": _db.host or "",
        "PORT": str(_db.port or ""),
    }
}
