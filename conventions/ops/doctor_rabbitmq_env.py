"""The doctor on RabbitMQ's server settings that AMQP and the management API do not show:
``dead_letter_worker_publisher_confirm_timeout``.

A countdown on quorum queues moves through Celery's ``celery_delayed_*`` queues by
at-least-once dead-lettering: the source queue's dead-letter worker keeps a message
until its target confirmed it. When the node leading the target dies with messages in
flight, their confirms never come, and the worker forwards them again only after this
timeout, 180 s by default; meanwhile no count shows them and the jobs run minutes late
(docs/howto/rabbitmq.md, *On a cluster*: 15 s is wanted).

It is an Erlang application setting (``advanced.config``): only ``rabbitmqctl eval``
reads it, with the node's Erlang cookie. The doctor runs
``conventions_rabbitmqctl`` (default ``rabbitmqctl``, only when the broker is on this
machine; ``["rabbitmqctl", "-n", "rabbit@mq1"]`` or ``["docker", "exec", "mq",
"rabbitmqctl"]`` elsewhere) and asks every node of the cluster through it; it reads,
never sets. It runs in the live checks only (``conventions doctor``), never at a
worker's start: ``rabbitmqctl`` starts an Erlang VM, a second or two.
"""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from conventions.config import settings
from conventions.ops.findings import WARNING, Finding
from conventions.tracing.scrubbing import scrub_text

SETTING = "conventions_rabbitmqctl"
KEY = "dead_letter_worker_publisher_confirm_timeout"
#: RabbitMQ's default (milliseconds)
DEFAULT_MS = 180_000
#: what docs/howto/rabbitmq.md asks for (milliseconds)
WANTED_MS = 15_000
#: the doctor warns from this value on (milliseconds): the default, and anything near it
WARN_FROM_MS = 60_000
#: seconds ``rabbitmqctl`` may take
TIMEOUT = 30.0
#: every node's value, in one call: ``[{Node, {ok, Ms} | undefined | {badrpc, _}}]``
EXPRESSION = (
    f"[{{N, rpc:call(N, application, get_env, [rabbit, {KEY}])}} || N <- [node() | nodes()]]."
)
_NODE = re.compile(r"\{'?([^,{}']+)'?,\s*(\{ok,\s*(\d+)\}|undefined|\{badrpc,[^}]*\}+)\}")
LOCAL = {"localhost", "127.0.0.1", "::1"}


@dataclass
class Read:
    """What ``rabbitmqctl`` said: node -> milliseconds (None: the node did not answer),
    or why it could not be read."""

    nodes: dict[str, int | None] = field(default_factory=dict)
    failure: str = ""


def command(conf: Any) -> list[str] | None:
    """The ``rabbitmqctl`` to run: the app's setting, else the plain one when the broker
    is on this machine, else None (the local node would be another broker)."""
    given = conf.get(SETTING)
    if given:
        return shlex.split(given) if isinstance(given, str) else [str(part) for part in given]
    host = urlsplit(str(conf.get("broker_url") or "").split(";")[0]).hostname or "localhost"
    return ["rabbitmqctl"] if host in LOCAL | {socket.gethostname()} else None


def parse(output: str) -> dict[str, int | None]:
    """``rabbitmqctl eval`` of :data:`EXPRESSION` -> node -> milliseconds."""
    nodes: dict[str, int | None] = {}
    for node, answer, ms in _NODE.findall(output):
        nodes[node] = int(ms) if ms else (DEFAULT_MS if answer == "undefined" else None)
    return nodes


def read(conf: Any, timeout: float = TIMEOUT) -> Read:
    """Every node's setting through the app's ``rabbitmqctl``."""
    run = command(conf)
    if run is None:
        return Read(failure=f"the broker is not on this machine and {SETTING} is not set")
    try:
        done = subprocess.run(  # the operator's own command
            [*run, "eval", EXPRESSION],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return Read(failure=scrub_text(str(exc)))
    nodes = parse(done.stdout)
    if done.returncode or not nodes:
        said = (done.stderr or done.stdout).strip().splitlines()
        return Read(failure=scrub_text(said[-1] if said else f"exit {done.returncode}"))
    return Read(nodes=nodes)


def wanted(conf: Any) -> bool:
    """Countdowns on quorum queues: what goes through the ``celery_delayed_*`` queues."""
    return settings.is_amqp(conf) and settings.quorum_queues(conf)


def confirm_findings(conf: Any, found: Read | None) -> Iterator[Finding]:
    """A warning per node whose timeout is :data:`WARN_FROM_MS` or more; one saying it
    could not be read."""
    if found is None:
        return
    fix = (f"set [{{rabbit, [{{{KEY}, {WANTED_MS}}}]}}]. in every node's advanced.config "
           "and restart the nodes one by one (docs/howto/rabbitmq.md, on a cluster)")  # fmt: skip
    if found.failure:
        yield Finding(
            WARNING, "rabbitmq-env-unreadable", KEY,
            f"could not read it ({found.failure}): countdowns forwarded toward a queue "
            "whose leader died wait this long, counted nowhere; check it by hand "
            f"(rabbitmqctl eval 'application:get_env(rabbit, {KEY}).'), or set {SETTING} "
            f"to a rabbitmqctl that reaches the broker; wanted: {WANTED_MS // 1000} s",
        )  # fmt: skip
        return
    slow = {node: ms for node, ms in found.nodes.items() if ms is not None and ms >= WARN_FROM_MS}
    if slow:
        shown = ", ".join(f"{node} {ms / 1000:g} s" for node, ms in sorted(slow.items()))
        yield Finding(
            WARNING, "rabbitmq-dlx-confirm-slow", KEY,
            f"{shown} (default {DEFAULT_MS // 1000} s): a countdown dead-lettered toward a "
            "queue whose leader died is forwarded again only after this, meanwhile "
            "counted in no queue and run that much late; " + fix,
        )  # fmt: skip
