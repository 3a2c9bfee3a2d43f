"""What the training commands (``train``, ``train --from-outcomes``) print, in one place.

- ``invoked_command()``: the command line as run, shell-quoted (``pointsman train`` without
  arguments), recorded in the trained model's provenance;
- ``progress_log(as_json)``: where progress lines go: stderr under ``--json`` (stdout carries
  the one JSON object), else stdout;
- ``echo_metrics(metrics, ...)``: the run's metrics: one JSON object with ``--json``, else the
  chosen ones as aligned lines, then the model directory when one was written.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import click


def invoked_command() -> str:
    """``pointsman <arguments>`` of this process, each argument shell-quoted."""
    return "pointsman " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "pointsman train"


def _to_stderr(message: str) -> None:
    click.echo(message, err=True)


def progress_log(as_json: bool) -> Callable[[str], None]:
    """The function progress lines go through (see the module docstring)."""
    return _to_stderr if as_json else click.echo


def echo_metrics(metrics: Mapping[str, float], *, as_json: bool, shown: Callable[[str], bool], width: int,
                 output: Path | None) -> None:
    """Print ``metrics``: sorted JSON with ``as_json`` (NaN as null), else ``key value`` lines of the
    keys ``shown`` accepts (key padded to ``width``) and ``model directory: <output>``."""
    from pointsman.training.train import metrics_json

    if as_json:
        click.echo(metrics_json(dict(metrics)))
        return
    for key in sorted(metrics):
        if shown(key):
            click.echo(f"  {key:{width}s} {metrics[key]:.4f}")
    if output is not None:
        click.echo(f"model directory: {output}")


__all__ = ["echo_metrics", "invoked_command", "progress_log"]
