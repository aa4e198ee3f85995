"""``make demo``: the whole story of the layer, told by real processes in about a minute.

``python -m demo`` (or ``python scripts/demo.py``; ``--embedded`` forces the embedded
default) starts an SMTP sink, a small web shop, the ``email`` and ``heavy`` workers with
their lane presets, the outbox relay and, later, beat; it plays a day of the shop
(orders through the outbox, a webhook burst with duplicates, a flaky mail provider, a
poison message, permanent failures, a replay, the daily report), prints a summary and
writes it to ``.demo/summary.json``, and stops every process it started.

Modules: ``run`` (the main), ``setup`` (where it runs), ``procs`` (starting and stopping
process groups), ``story`` (the scenario), ``observe`` (queue sampling, reading the
store), ``summary`` (the numbers and the printout), ``smtp_sink`` and ``webapp`` (two
of the processes), ``schedule`` (beat's entries).
"""
