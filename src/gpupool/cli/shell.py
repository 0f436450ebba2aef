"""Commands of the shell part of the CLI (issue 18); filled in by its owner."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
