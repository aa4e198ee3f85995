"""The fleet's publisher: ``python -m tasks.publish <parity> <count> <delayed-every>``.

Publishes ``fleet.apply_event.v1`` for the events ``evt_0001``..``evt_<count>`` of one
parity (``odd``: the old runtime's share, ``even``: the new's), every
``delayed-every``-th one with a countdown of 1 to 8 s (it waits in the delayed set, which
either runtime's workers move when it is due).
"""

from __future__ import annotations

import sys

from tasks import apply_event


def main(parity: str, count: int, delayed_every: int) -> None:
    first = 1 if parity == "odd" else 2
    published = delayed = 0
    for number in range(first, count + 1, 2):
        options = {}
        if delayed_every and (number // 2) % delayed_every == 0:
            options["countdown"] = 1 + number % 8
            delayed += 1
        apply_event.apply_async(kwargs={"event_id": f"evt_{number:04d}"}, **options)
        published += 1
    print(f"published {published} ({delayed} delayed)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
