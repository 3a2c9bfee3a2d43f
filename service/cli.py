"""The ``pointsman`` command-line interface (click)."""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="pointsman")
def main() -> None:
    """Pointsman: a routing policy engine for LLM inference."""
