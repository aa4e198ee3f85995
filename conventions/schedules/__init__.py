"""Schedules: entries with business keys, overlap policies and the watchdog."""
