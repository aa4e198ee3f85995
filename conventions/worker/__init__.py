"""The worker side of a job: its run path and exits, job context, consumer, lifecycle."""
