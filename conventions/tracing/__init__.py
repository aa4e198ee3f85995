"""Correlation: the trace context, its headers, scrubbing, and log records."""
