"""A 3-node RabbitMQ cluster of the test's own on loopback, which a test may kill, pause
and start again node by node.

Three :class:`~tests.acceptance.rabbit_node.RabbitNode` of the machine's installation
(ports 5700-5702, distribution ports 25700-25702, names ``cc57NN@localhost``), each with
its own database and log folder, one Erlang cookie for the three (``HOME`` is the
cluster's folder). The first node starts alone, the two others join it
(``stop_app; join_cluster; start_app``). Every node's configuration says
``queue_leader_locator = balanced`` (RabbitMQ 3.10+: a new quorum queue's leader goes to
the node with the fewest leaders, not the node the declaring client is connected to) and
``cluster_partition_handling = pause_minority`` (a node cut off from the two others
pauses itself until it sees them again); ``-kernel net_ticktime`` is short
(:data:`NET_TICKTIME`) so that a paused node is declared down in seconds, not a minute.
Its ``advanced.config`` shortens ``dead_letter_worker_publisher_confirm_timeout``
(:data:`DLX_CONFIRM_TIMEOUT`), as docs/howto/rabbitmq.md asks of a cluster: a delayed
message whose dead-letter hop lost its confirm to a killed node is forwarded again after
that long, not after RabbitMQ's 3 minutes.

The machine's node (5672) is never touched. Clients get :attr:`RabbitCluster.url`, a
failover list of the three nodes' URLs (``amqp://a;amqp://b;amqp://c``, which kombu
tries in turn).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.acceptance.rabbit_node import RabbitNode
from tests.isolation import fixed

#: the AMQP ports a cluster may take, the first three by default (the distribution ports
#: are 20000 above)
PORTS = tuple(fixed(port) for port in range(5700, 5705))
#: seconds without a tick before a node declares a peer down (Erlang's default is 60)
NET_TICKTIME = 8
CONF = "queue_leader_locator = balanced\ncluster_partition_handling = pause_minority\n"
#: how long a quorum queue's at-least-once dead-letter worker waits for the target queues'
#: confirms before it forwards a message again (ms; RabbitMQ's default is 180,000)
DLX_CONFIRM_TIMEOUT = 15_000
#: the ``advanced.config`` of a node of the cluster (no ``rabbitmq.conf`` key for it on 3.10)
ADVANCED = "[{{rabbit, [{{dead_letter_worker_publisher_confirm_timeout, {timeout}}}]}}].\n"
#: the outbox of every quorum queue: dead-lettered messages not yet confirmed by their
#: targets (``rabbitmqctl list_queues`` counts none of them), read from a node's member
DEAD_LETTERED = (
    "[{element(4, amqqueue:get_name(Q)), case ra:local_query({element(1, amqqueue:get_pid(Q)),"
    " node()}, fun rabbit_fifo:overview/1, 5000) of {ok, {_, M}, _} -> maps:get(num_discarded,"
    " M, 0) + maps:get(num_discard_checked_out, M, 0); _ -> -1 end} || Q <- rabbit_amqqueue:list(),"
    " amqqueue:get_type(Q) =:= rabbit_quorum_queue]."
)
#: the management API's port above the node's AMQP port (when enabled)
MANAGEMENT_OFFSET = 10
#: the cluster's shared Erlang cookie
COOKIE = "CCRABBITCLUSTERCOOKIE"


@dataclass(frozen=True)
class Membership:
    """One quorum queue as ``rabbitmqctl list_queues name leader members online`` says."""

    name: str
    leader: str
    members: tuple[str, ...]
    online: tuple[str, ...]


class ClusterNode(RabbitNode):
    """A node of the cluster: a short net tick time, killable by signal, and with the
    management plugin on :data:`MANAGEMENT_OFFSET` above its AMQP port when asked."""

    def __init__(
        self, folder: Path, port: int, home: Path, management: bool = False,
        dlx_confirm_timeout: int | None = DLX_CONFIRM_TIMEOUT,
    ) -> None:  # fmt: skip
        extra = f"management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = {port + MANAGEMENT_OFFSET}\n"
        advanced = ADVANCED.format(timeout=dlx_confirm_timeout) if dlx_confirm_timeout else ""
        super().__init__(
            folder, port=port, home=home, conf=CONF + (extra if management else ""),
            advanced=advanced,
        )  # fmt: skip
        if management:
            (folder / "enabled_plugins").write_text("[rabbitmq_management].\n")

    @property
    def management_url(self) -> str:
        return f"http://guest:guest@127.0.0.1:{self.port + MANAGEMENT_OFFSET}"

    def env(self) -> dict[str, str]:
        env = super().env()
        env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"] = f"-kernel net_ticktime {NET_TICKTIME}"
        return env

    def queues_ctl(self, *args: str) -> str:
        """``rabbitmq-queues -n <node> ...`` (membership: ``add_member``, ``delete_member``)."""
        done = subprocess.run(
            [str(Path(self.ctl_binary).with_name("rabbitmq-queues")), "-n", self.name, *args],
            env=self.env(), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmq-queues {' '.join(args)}: {done.stderr or done.stdout}")
        return done.stdout

    def pid(self) -> int:
        """The node's Erlang VM (``beam.smp``), from its pid file."""
        return int(self.pid_file.read_text().strip())

    def kill_nine(self) -> None:
        """SIGKILL the node's VM: no goodbye to its peers or its clients."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid(), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while self._alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)

    def _alive(self) -> bool:
        try:
            os.kill(self.pid(), 0)
        except (ProcessLookupError, FileNotFoundError):
            return False
        return Path(f"/proc/{self.pid()}").exists() and "Z" not in _state(self.pid())

    def pause(self, seconds: float) -> None:
        """SIGSTOP the VM ``seconds``, then SIGCONT: its peers stop hearing its ticks
        (a partition, seen from them), and it finds itself cut off when it wakes."""
        os.kill(self.pid(), signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(self.pid(), signal.SIGCONT)

    def cpu_seconds(self) -> float:
        """User + system CPU time of the node's VM so far (``/proc/<pid>/stat``)."""
        fields = Path(f"/proc/{self.pid()}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


class RabbitCluster:
    """Three :class:`ClusterNode` in ``folder``, clustered."""

    def __init__(
        self, folder: Path, ports: tuple[int, ...] = PORTS[:3], management: bool = False,
        dlx_confirm_timeout: int | None = DLX_CONFIRM_TIMEOUT,
    ) -> None:  # fmt: skip
        self.folder = folder
        cookie = folder / ".erlang.cookie"
        cookie.write_text(COOKIE)
        cookie.chmod(0o400)
        self.nodes: list[ClusterNode] = []
        for port in ports:
            own = folder / f"node{port}"
            own.mkdir(exist_ok=True)
            self.nodes.append(ClusterNode(own, port, folder, management, dlx_confirm_timeout))

    @property
    def url(self) -> str:
        """The failover list of the three nodes (kombu tries each in turn)."""
        return ";".join(node.url for node in self.nodes)

    def node(self, name: str) -> ClusterNode:
        return next(node for node in self.nodes if node.name == name)

    def start(self) -> None:
        """Start the three VMs at once, then join the second and third to the first."""
        _each(self.nodes, lambda node: node.start())
        first = self.nodes[0]
        for node in self.nodes[1:]:
            node.ctl("stop_app")
            node.ctl("join_cluster", first.name)
            node.ctl("start_app")
        running = self.running()
        if sorted(running) != sorted(node.name for node in self.nodes):
            raise RuntimeError(f"the cluster did not form: running {running}")

    def stop(self) -> None:
        _each(self.nodes, lambda node: node.stop())

    def any_up(self) -> ClusterNode:
        """A node whose VM answers (the one to ask ``rabbitmqctl``)."""
        for node in self.nodes:
            if node.pid_file.exists() and node._alive():
                return node
        raise RuntimeError("no node of the cluster is up")

    def running(self) -> list[str]:
        """The nodes the cluster counts as running (``cluster_status``)."""
        out = self.any_up().ctl("cluster_status", "--formatter", "json")
        return list(json.loads(out).get("running_nodes", []))

    def memberships(self) -> dict[str, Membership]:
        """Each quorum queue's leader, members and online members."""
        out = self.any_up().ctl(
            "list_queues", "-q", "--formatter", "json",
            "name", "type", "leader", "members", "online",
        )  # fmt: skip
        found: dict[str, Membership] = {}
        for row in json.loads(out or "[]"):
            if row.get("type") != "quorum":
                continue
            found[row["name"]] = Membership(
                row["name"], str(row.get("leader", "")),
                tuple(row.get("members") or ()), tuple(row.get("online") or ()),
            )  # fmt: skip
        return found

    def dead_lettered(self) -> dict[str, int]:
        """Per quorum queue, the messages it dead-lettered whose targets have not all
        confirmed them yet (at-least-once: they stay in the source queue, uncounted by
        ``list_queues``); -1 where the node has no answer for a queue."""
        out = " ".join(self.any_up().ctl("eval", DEAD_LETTERED).split())
        return {name: int(n) for name, n in re.findall(r'\{<<"([^"]+)">>,(-?\d+)\}', out)}

    def cpu_seconds(self) -> float:
        """The three VMs' CPU time so far, summed."""
        return sum(node.cpu_seconds() for node in self.nodes)


def _each(nodes: list[ClusterNode], action: object) -> None:
    """Run ``action(node)`` on every node at once (a node's start is mostly waiting)."""
    errors: list[BaseException] = []

    def run(node: ClusterNode) -> None:
        try:
            action(node)  # type: ignore[operator]
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(node,)) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


@contextlib.contextmanager
def private_cluster(
    folder: Path, management: bool = False, dlx_confirm_timeout: int | None = DLX_CONFIRM_TIMEOUT
) -> Iterator[RabbitCluster]:
    """A started :class:`RabbitCluster`, stopped after (its files stay in ``folder``);
    ``dlx_confirm_timeout=None`` keeps RabbitMQ's own (180 s)."""
    cluster = RabbitCluster(folder, management=management, dlx_confirm_timeout=dlx_confirm_timeout)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        for node in cluster.nodes:  # a killed node may have left its VM behind
            if node.pid_file.exists() and node._alive():
                node.kill_nine()


def main() -> None:
    """``python -m tests.acceptance.rabbit_cluster [--nodes N] [--management] [--serve]``:
    start a cluster (of ``N`` nodes, 3 by default) in a temporary folder and say how long
    it took; with ``--serve``, print its failover URL and keep it until interrupted (for
    ``python -m bench.scale --amqp URL``)."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m tests.acceptance.rabbit_cluster")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--management", action="store_true")
    parser.add_argument("--serve", action="store_true")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # kill <pid>: stop it first
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        cluster = RabbitCluster(Path(tmp), PORTS[: args.nodes], management=args.management)
        try:
            cluster.start()
            print(f"started in {time.monotonic() - started:.1f}s: {cluster.running()}")
            print(cluster.url, flush=True)
            while args.serve:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
