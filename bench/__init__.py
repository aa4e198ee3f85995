"""Benchmarks against raw Celery, measured in the same run (``make bench``).

Never part of the tests' pass/fail: machines are noisy, so results are ratios of medians
of interleaved A/B pairs, not absolute times.
"""
