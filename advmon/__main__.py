"""``python -m advmon`` runs the CLI."""

from advmon.cli import entry_point

entry_point()
