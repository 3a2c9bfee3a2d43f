"""The ``pointsman`` command-line interface (click).

Subcommands live in small modules, each with ``register(group)``, attached here:
``route``/``serve`` (``cli_route``), ``policy check``/``policy test`` (``cli_policy``),
``train``/``evaluate`` (``cli_training``, when installed), ``compare``/``promote``/``calibrate``
(``cli_loop``, the retraining loop).
"""

from __future__ import annotations

import importlib.util

import click

from pointsman.service import cli_policy, cli_replay, cli_route


@click.group()
@click.version_option(package_name="pointsman")
def main() -> None:
    """Pointsman: a routing policy engine for LLM inference."""


cli_route.register(main)
cli_policy.register(main)
cli_replay.register(main)

# The training commands ship in their own module; only its absence is tolerated,
# an error inside it is a real error.
if importlib.util.find_spec("pointsman.service.cli_training") is not None:
    from pointsman.service import cli_training

    cli_training.register(main)
if importlib.util.find_spec("pointsman.service.cli_loop") is not None:
    from pointsman.service import cli_loop

    cli_loop.register(main)
