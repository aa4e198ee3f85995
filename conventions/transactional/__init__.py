"""Work committed in the caller's own transaction: the outbox, its relay, once()."""
