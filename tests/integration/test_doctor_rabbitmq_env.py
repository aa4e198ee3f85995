"""The doctor reads RabbitMQ's ``dead_letter_worker_publisher_confirm_timeout``
(:mod:`conventions.ops.doctor_rabbitmq_env`) through ``rabbitmqctl eval`` on the
machine's RabbitMQ, read only: the default 180 s is named with the fix, and a
``rabbitmqctl`` refused (no Erlang cookie) is a 'could not read'.

The 3-node cluster of ``tests/acceptance/rabbit_cluster.py`` (15 s) is not started here
(a minute of Erlang VMs); its answer's shape is parsed below."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from typing import Any

import pytest

from conventions.config.profile import reliable
from conventions.ops import doctor_rabbitmq_env as env
from tests.fixtures import unavailable
from tests.integration import support_rabbit_quorum as q

pytestmark = [pytest.mark.usefixtures("services"), pytest.mark.timeout(120)]


def conf(**extra: Any) -> dict[str, Any]:
    built = dict(reliable(broker_url=q.AMQP_URL, store_url=q.STORE_URL,
                          result_backend=q.STORE_URL))  # fmt: skip
    return {**built, **extra}


def node_value() -> int:
    """The machine's node's value by another road: ``rabbitmqctl environment``."""
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl is not installed (RabbitMQ on another machine)")
    done = subprocess.run(["rabbitmqctl", "environment"], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    if done.returncode:
        unavailable("rabbitmqctl", RuntimeError(done.stderr))
    found = re.search(rf"{env.KEY},\s*(\d+)", done.stdout)
    return int(found.group(1)) if found else env.DEFAULT_MS


def test_the_doctor_names_a_node_left_at_the_default_confirm_timeout() -> None:
    expected = node_value()
    checked = conf()

    read = env.read(checked)
    findings = list(env.confirm_findings(checked, read))

    assert not read.failure, read.failure
    assert list(read.nodes.values()) == [expected]
    if expected >= env.WARN_FROM_MS:  # the machine's RabbitMQ: the default, 180 s
        [found] = findings
        assert found.code == "rabbitmq-dlx-confirm-slow"
        assert f"{next(iter(read.nodes))} {expected / 1000:g} s" in found.message
        assert "advanced.config" in found.message and "15000" in found.message
    else:
        assert findings == []


def test_the_live_doctor_runs_the_check_on_quorum_queues() -> None:
    from conventions.ops import doctor_live

    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl is not installed (RabbitMQ on another machine)")
    live = doctor_live.observe(q.app, timeout=1.0)

    assert live.dlx_confirm is not None
    codes = {f.code for f in doctor_live.live_checks(q.app, live)}
    assert codes & {"rabbitmq-dlx-confirm-slow", "rabbitmq-env-unreadable"} or (
        min(v or 0 for v in live.dlx_confirm.nodes.values()) < env.WARN_FROM_MS
    )


def test_a_rabbitmqctl_without_the_cookie_is_could_not_read() -> None:
    refused = "Authentication failed (rejected by the remote node), please check the Erlang cookie"
    checked = conf(
        conventions_rabbitmqctl=[sys.executable, "-c", f"import sys; sys.exit({refused!r})"]
    )

    [found] = env.confirm_findings(checked, env.read(checked))

    assert found.code == "rabbitmq-env-unreadable"
    assert "could not read it (Authentication failed" in found.message


def test_a_remote_broker_is_not_read_through_the_local_node() -> None:
    checked = conf(broker_url="amqp://guest:guest@mq.example.invalid:5672//")

    assert env.command(checked) is None
    [found] = env.confirm_findings(checked, env.read(checked))
    assert "could not read it (the broker is not on this machine" in found.message


def test_every_node_of_a_cluster_is_named() -> None:
    said = ("[{rabbit@rmq1,{ok,15000}},\n {rabbit@rmq2,{ok,180000}},\n"
            " {'rabbit@rmq-3',{badrpc,nodedown}}]\n")  # fmt: skip

    nodes = env.parse(said)

    assert nodes == {"rabbit@rmq1": 15000, "rabbit@rmq2": 180000, "rabbit@rmq-3": None}
    [found] = env.confirm_findings({}, env.Read(nodes=nodes))
    assert found.message.startswith("rabbit@rmq2 180 s (default 180 s)")
