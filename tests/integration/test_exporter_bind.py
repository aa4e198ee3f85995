"""The metrics exporter is not an open door: loopback by default, bounded labels.

``/metrics`` has no authentication, so a real ``conventions metrics serve`` started with
no ``--addr`` must not answer on the machine's other addresses; binding elsewhere is a
deliberate setting. Task names come from whoever publishes: a foreign producer's names
(unknown to the app) are counted under one ``task="other"`` label, never one label each.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection, Producer

from conventions.app import App
from conventions.ops.exporter import OTHER_TASK, bind_address
from tasks import app
from tests.integration.exporter import ExporterProcess
from tests.integration.helpers import dead_letter_of, publish_foreign, wait_for

APP = "tests.integration.support_metrics:app"
FOREIGN = ("spam.flood_1.v1", "spam.flood_2.v1", "not-even-a-convention-name")


def outside_address() -> str:
    """An address of this machine that is not 127.0.0.1: a non-loopback one when the
    machine has one, else 127.0.0.2 (a server bound to 0.0.0.0 answers there too, one
    bound to 127.0.0.1 does not), so the test never has to be skipped."""
    try:
        found = subprocess.run(
            ["hostname", "-I"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        found = ""
    for address in found.split():
        if "." in address and not address.startswith("127."):
            return address
    return "127.0.0.2"


def answers(host: str, port: int) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted."""
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "exporter.log"


def test_with_no_address_given_the_exporter_answers_on_loopback_only(
    services: None, log: Path
) -> None:
    outside = outside_address()
    unset = {"CONVENTIONS_METRICS_ADDR": ""}  # the reference config's default, whatever the shell
    with ExporterProcess(APP, log, addr=None, env=unset) as exporter:
        assert "celery_conventions_broker_up" in exporter.text()
        assert not answers(outside, exporter.port)
    assert "http://127.0.0.1:" in log.read_text()  # it says where it listens


def test_conventions_metrics_addr_binds_the_exporter_where_it_says(
    services: None, log: Path
) -> None:
    outside = outside_address()
    env = {"CONVENTIONS_METRICS_ADDR": outside}
    with ExporterProcess(APP, log, addr=None, host=outside, env=env) as exporter:
        assert "celery_conventions_broker_up" in exporter.text()
        assert not answers("127.0.0.1", exporter.port)


def test_an_app_without_the_setting_binds_loopback_and_the_flag_wins_over_it() -> None:
    bare = App("bind_test", set_as_current=False)
    assert bind_address(bare) == "127.0.0.1"
    bare.conf.conventions_metrics_addr = "10.1.2.3"
    assert bind_address(bare) == "10.1.2.3"
    assert bind_address(bare, "0.0.0.0") == "0.0.0.0"


@pytest.fixture
def exporter(services: None, log: Path) -> Iterator[ExporterProcess]:
    with ExporterProcess(APP, log) as process:
        yield process


@pytest.mark.usefixtures("clean_store", "thread_worker")
def test_task_names_the_app_does_not_register_are_counted_under_one_label(
    exporter: ExporterProcess,
) -> None:
    with Connection(app.conf.broker_url) as conn:
        ids = [publish_foreign(Producer(conn), name, {}, "email") for name in FOREIGN]
    for task_id in ids:
        wait_for(lambda task_id=task_id: dead_letter_of(task_id), timeout=30)
    scrape = exporter.scrape()
    labels = {task for (_, _, task) in scrape}
    assert not labels & set(FOREIGN)
    assert scrape["celery_conventions_jobs_dead_lettered_total", "", OTHER_TASK] == len(FOREIGN)
