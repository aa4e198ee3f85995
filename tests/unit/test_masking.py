"""Credentials in URL-like settings never reach what Celery or the layer prints.

Celery hides the settings it knows (``broker_url``, ``*backend*``, names with ``PASS``,
``SECRET``, ``DATABASE``...), not the layer's: ``conventions_store_url``, the reference
config's ``REDIS_URL``, ``conventions_outbox_url`` and ``shop_smtp_url`` went out with
their passwords in ``celery report`` and ``celery inspect conf``. The real worker and
the real ``celery report`` are in ``tests/integration/test_settings_masking.py``.
"""

from __future__ import annotations

import json

import pytest
from celery.app.utils import bugreport

from conventions import ConfigurationError
from conventions.app import App
from conventions.cli.outbox import engine_for
from conventions.config.settings import MASK, mask_url, masked
from conventions.store import resolve_url
from conventions.tracing.scrubbing import scrub_text

SECRET = "s3cret"

#: settings as a project holds them, each with a password somewhere
LEAKY = {
    "conventions_store_url": f"redis://:{SECRET}@cache:6379/1",
    "REDIS_URL": f"rediss://default:{SECRET}@cache:6380/0",
    "conventions_outbox_url": f"postgresql://app:{SECRET}@db/app",
    "shop_smtp_url": f"smtp://mailer:{SECRET}@mail:587",
    "conventions_schedule_source": f"redis://cache/0?password={SECRET}&db=2",
    "nested": {"replicas": [f"redis://:{SECRET}@r1:6379/0", ("ok", f"redis://u:{SECRET}@r2")]},
    "sentry_dsn": f"https://{SECRET}@o1.ingest.sentry.io/42",
}


def leaky_app() -> App:
    app = App("masking_test", set_as_current=False)
    app.conf.update(LEAKY)
    return app


def test_celery_report_and_inspect_conf_show_no_password_of_any_url_setting() -> None:
    app = leaky_app()
    shown = [
        app.conf.humanize(),  # celery report
        app.conf.humanize(with_defaults=True),
        json.dumps(app.conf.table(), default=repr),  # celery inspect conf
        json.dumps(app.conf.table(with_defaults=True), default=repr),
        bugreport(app),
    ]
    for text in shown:
        assert SECRET not in text
    table = app.conf.table()
    assert table["conventions_store_url"] == f"redis://:{MASK}@cache:6379/1"  # host kept
    assert table["conventions_outbox_url"] == f"postgresql://app:{MASK}@db/app"  # user kept
    assert table["sentry_dsn"] == f"https://{MASK}@o1.ingest.sentry.io/42"  # the DSN's key


def test_the_settings_themselves_keep_their_passwords() -> None:
    app = leaky_app()
    assert app.conf.conventions_store_url == LEAKY["conventions_store_url"]
    assert app.conventions_settings.store_url == LEAKY["conventions_store_url"]
    assert app.conf.table(censored=False)["REDIS_URL"] == LEAKY["REDIS_URL"]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://:{SECRET}@h:6379/0", f"redis://:{MASK}@h:6379/0"),
        (f"postgresql+psycopg://app:{SECRET}@db:5432/app", f"postgresql+psycopg://app:{MASK}@db:5432/app"),
        (f"sentinel://:{SECRET}@a:26379;sentinel://:{SECRET}@b:26379/0",
         f"sentinel://:{MASK}@a:26379;sentinel://:{MASK}@b:26379/0"),
        (f"redis://h/0?db=1&password={SECRET}", f"redis://h/0?db=1&password={MASK}"),
        (f"amqp://u:{SECRET}@rabbit//?auth_token={SECRET}", f"amqp://u:{MASK}@rabbit//?auth_token={MASK}"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("sqlite:////var/lib/app/store.db", "sqlite:////var/lib/app/store.db"),
    ],
)  # fmt: skip
def test_a_url_is_shown_with_its_password_masked_and_the_rest_kept(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_a_libpq_style_connection_string_is_masked_too() -> None:
    assert masked(f"host=db user=app password={SECRET}") == f"host=db user=app password={MASK}"
    assert masked(42) == 42


def test_an_unsupported_store_url_is_refused_without_repeating_its_password() -> None:
    for url in (f"mysql://app:{SECRET}@db/app", f"app:{SECRET}@db/app"):
        with pytest.raises(ValueError, match="scheme") as refused:
            resolve_url(url)
        assert SECRET not in str(refused.value)


def test_an_outbox_url_that_is_not_sql_is_refused_without_repeating_its_password() -> None:
    app = leaky_app()
    with pytest.raises(ConfigurationError, match="SQL") as refused:
        engine_for(app, f"redis://:{SECRET}@cache:6379/0")
    assert SECRET not in str(refused.value)


def test_exception_text_with_a_password_and_no_user_is_scrubbed() -> None:
    text = f"cannot reach redis://:{SECRET}@cache:6379/0 nor postgresql://u:{SECRET}@db/x"
    assert SECRET not in scrub_text(text)
