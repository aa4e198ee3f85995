"""``python -m bench.launch [options] -- celery args...``: a Celery worker for the benchmarks.

Runs Celery's own command line in this process after three optional changes that must
happen before Celery, kombu or redis-py are imported: ``--no-hiredis`` hides the C reply
parser from redis-py (it picks hiredis by itself when installed), ``--orjson`` swaps
kombu's JSON codec (:mod:`bench.codec`), ``--profile FILE`` runs the whole worker under
cProfile and writes its stats to ``FILE`` at exit (use ``-P solo`` so that one process
does the whole job: receive, run, store, ack). ``--ready FILE`` is touched when the
worker is ready to consume.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our options, and the arguments after ``--`` (Celery's)."""
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m bench.launch")
    parser.add_argument("--no-hiredis", action="store_true")
    parser.add_argument("--orjson", action="store_true")
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--ready", type=Path)
    return parser.parse_args(argv[:split]), argv[split + 1 :]


def main(argv: list[str]) -> None:
    opts, celery_args = parse(argv)
    if opts.no_hiredis:
        sys.modules["hiredis"] = None  # type: ignore[assignment]  # import fails: pure parser
    if opts.orjson:
        from bench import codec

        codec.install()
    from celery import signals

    ready: Path | None = opts.ready
    if ready is not None:
        signals.worker_ready.connect(lambda **_: ready.touch(), weak=False)
    from celery.bin.celery import main as celery_main

    sys.argv = ["celery", *celery_args]
    if opts.profile is None:
        celery_main()
        return
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    try:
        celery_main()
    except SystemExit:
        pass
    finally:
        profile.disable()
        profile.dump_stats(str(opts.profile))


if __name__ == "__main__":
    main(sys.argv[1:])
