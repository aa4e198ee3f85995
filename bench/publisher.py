"""``python -m bench.publisher VARIANT [--orjson] [--no-hiredis]``: one producer process.

Each variant publishes from a process of its own, so that nothing of one library runs in
another's publishes (our ``before_task_publish`` handler is process-wide). The harness
writes a count on stdin; the process publishes that many jobs with fresh ids and writes
back the seconds it took. ``quit`` (or end of input) ends it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

Publish = Callable[[str], object]


def publisher(variant: str) -> Publish:
    """The ``.delay()`` (or the peer's equivalent) of ``variant``'s no-op job."""
    from bench import common

    if variant in common.RAW:
        from bench import apps_raw

        raw_task = getattr(apps_raw, variant).tasks[f"bench.noop_{variant}"]
        return lambda order_id: raw_task.delay(order_id=order_id)
    from bench import peer_apps

    if variant in peer_apps.PEERS:
        return peer_apps.publisher(variant)
    from bench import apps

    task = getattr(apps, variant).tasks[apps.task_name(variant)]
    return lambda order_id: task.delay(order_id=order_id)


def timed(publish: Publish, n: int) -> float:
    """Seconds for ``n`` publishes with fresh ids (made before the clock starts)."""
    ids = [f"ord_{uuid.uuid4().hex[:16]}" for _ in range(n)]
    start = time.perf_counter()
    for order_id in ids:
        publish(order_id)
    return time.perf_counter() - start


def round_trips(publish: Publish, n: int) -> list[float]:
    """Seconds from ``.delay()`` to the result in hand, ``n`` times, one job at a time."""
    out = []
    for _ in range(n):
        order_id = f"ord_{uuid.uuid4().hex[:16]}"
        start = time.perf_counter()
        result: Any = publish(order_id)
        result.get(timeout=30)
        out.append(time.perf_counter() - start)
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.publisher")
    parser.add_argument("variant")
    parser.add_argument("--orjson", action="store_true")
    parser.add_argument("--no-hiredis", action="store_true")
    parser.add_argument("--profile", help="write the publishes' cProfile stats here at the end")
    opts = parser.parse_args(argv)
    if opts.no_hiredis:
        sys.modules["hiredis"] = None  # type: ignore[assignment]
    if opts.orjson:
        from bench import codec

        codec.install()
    publish = publisher(opts.variant)
    print("ready", flush=True)
    if opts.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.runcall(serve, publish)
        profiler.dump_stats(opts.profile)
    else:
        serve(publish)


def serve(publish: Publish) -> None:
    """Answer the harness's commands on stdin until ``quit``."""
    for line in sys.stdin:
        command = line.split()
        if not command or command[0] == "quit":
            break
        if command[0] == "rt":
            print(",".join(f"{t:.6f}" for t in round_trips(publish, int(command[1]))), flush=True)
        else:
            print(f"{timed(publish, int(command[0])):.6f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])


class Producer:
    """The harness's end of one ``bench.publisher`` subprocess."""

    def __init__(
        self, variant: str, flags: Sequence[str] = ("--no-hiredis",), *, wait: bool = True
    ) -> None:
        from bench import common

        self.variant = variant
        self.proc = subprocess.Popen(
            [common.python(), "-m", "bench.publisher", variant, *flags],
            cwd=common.ROOT,
            env=common.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Until the process has imported its app and is ready to publish."""
        line = self._read()
        if line != "ready":
            raise RuntimeError(f"publisher {self.variant} did not start: {line!r}")

    def _read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line and self.proc.poll() is not None:
            raise RuntimeError(f"publisher {self.variant} exited ({self.proc.returncode})")
        return line

    def publish(self, n: int) -> float:
        """Publish ``n`` jobs; the seconds it took."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return float(self._read())

    def round_trips(self, n: int) -> list[float]:
        """Seconds of ``n`` round trips (publish, run, result back), one at a time."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"rt {n}\n")
        self.proc.stdin.flush()
        return [float(x) for x in self._read().split(",")]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
