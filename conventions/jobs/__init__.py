"""Declaring a job: payloads, workloads and queues, backoff, error decisions."""
