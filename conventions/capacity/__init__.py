"""Capacity: dependency limits (rate, concurrency), producer backpressure, leases."""
