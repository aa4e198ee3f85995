"""The ``conventions`` command: one module per group of subcommands."""
