"""The ``pointsman`` command-line interface (click).

Subcommands live in small modules and are attached here:
``route``/``serve`` (decisions), ``train``/``evaluate`` (the estimator).
"""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="pointsman")
def main() -> None:
    """Pointsman: a routing policy engine for LLM inference."""
