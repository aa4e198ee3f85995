"""What operators see: audit trail, alerts, progress, queues, dead letters, exporter."""
