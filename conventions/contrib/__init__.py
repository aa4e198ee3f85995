"""Integrations: web middleware, trigger-and-poll helpers, the Django outbox app."""
