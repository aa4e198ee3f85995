"""No password of a URL setting reaches ``celery inspect conf`` or ``celery report``.

A real worker of the reference app runs on a real Redis that requires a password (the
broker, the results and the layer's store all on it), with a shop database and an SMTP
URL that carry one too. Any client of the broker can ask a worker for its settings, so
the reply is read the way such a client reads it: a plain Celery app's broadcast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery

from tests.fixtures import ROOT
from tests.integration.helpers import SpareRedis, wait_for

SECRET = "s3cret-for-masking"


@pytest.fixture
def locked_redis() -> Iterator[SpareRedis]:
    """A real Redis that refuses clients without the password."""
    server = SpareRedis(password=SECRET)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def leaky_env(server: SpareRedis) -> dict[str, str]:
    """The reference config's variables, each URL with a password that works."""
    base = f"redis://:{SECRET}@127.0.0.1:{server.port}"
    shop = os.environ["DATABASE_URL"].replace("postgres@", f"postgres:{SECRET}@", 1)
    assert SECRET in shop  # trust auth: PostgreSQL ignores the password
    return {
        "REDIS_URL": f"{base}/0",
        "CONVENTIONS_STORE_URL": f"{base}/1",
        "DATABASE_URL": shop,  # also conventions_outbox_url, by default
        "SMTP_URL": f"smtp://mailer:{SECRET}@127.0.0.1:2525",
    }


def test_a_worker_answers_inspect_conf_with_every_password_masked(
    services: None, locked_redis: SpareRedis, worker_process: Callable[..., Any]
) -> None:
    env = leaky_env(locked_redis)
    worker = worker_process("masked", "email", concurrency=1, **env)
    client = Celery("inspector", broker=env["REDIS_URL"], set_as_current=False)
    try:
        inspect = client.control.inspect(timeout=5)
        replies = wait_for(inspect.conf, timeout=30)
        everything = wait_for(lambda: inspect.conf(with_defaults=True), timeout=30)
    finally:
        client.close()
    (conf,) = replies.values()
    assert conf["conventions_store_url"].endswith(f"@127.0.0.1:{locked_redis.port}/1")
    assert {"REDIS_URL", "conventions_outbox_url", "shop_smtp_url"} <= set(conf)
    assert SECRET not in json.dumps(replies)
    assert SECRET not in json.dumps(everything)
    assert SECRET not in worker.output()  # the banner, the doctor's findings, the logs


def test_celery_report_shows_every_url_setting_with_its_password_masked(
    locked_redis: SpareRedis,
) -> None:
    env = {**os.environ, **leaky_env(locked_redis), "PYTHONPATH": str(ROOT)}
    report = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "report"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert "conventions_store_url" in report.stdout
    assert "REDIS_URL" in report.stdout
    assert SECRET not in report.stdout + report.stderr
