"""The command line's one error convention: click exceptions that know their message and exit status.

A command raises one of these and click prints it and exits (``ClickException.show``, then
``exit_code``); nothing else in ``cli/`` echoes an error or calls ``sys.exit``:

- ``InputError``: bad input or usage (a bad option value, an unreadable or invalid file, a
  missing extra); one ``Error: <message>`` line on stderr, exit status 2;
- ``ConfigProblems``: an invalid fleet or policy file; one ``Error: <file:line:col: code:
  message>`` line per located problem on stderr, exit status 2;
- ``CheckFailed``: a check ran and found problems (``policy check``/``policy test`` failures, a
  refused promotion); the command has printed its findings, the exception adds its message (if
  any) to stderr as is, exit status 1;
- ``BudgetRefused``: a budget refused the request (``POST /v1/route``'s 429 ``budget_exhausted``: a
  target could take it, only over a budget); one ``Error: budget_exhausted: <message>`` line on
  stderr, exit status 3.

``validation_message`` and ``os_error_message`` turn the errors no command catches itself
(pydantic ``ValidationError``, ``OSError``) into the one line ``InputError`` prints
(``main.PointsmanGroup``).
"""

from __future__ import annotations

import math
from typing import IO

import click
from pydantic import ValidationError

from pointsman.errors import ConfigError


class FiniteFloat(click.ParamType):
    """A float option that refuses NaN and infinities (click's ``float`` and ``FloatRange`` take
    ``nan``, which compares false with everything: a trace window ``--end-s nan`` silently meant none)."""

    name = "float"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """``value`` as a finite float; fails (exit 2) otherwise."""
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


#: ``--seed``: numpy's generators take no negative seed (a traceback before).
SEED = click.IntRange(min=0)


class InputError(click.ClickException):
    """Bad input: printed as one ``Error: ...`` line, exit status 2."""

    exit_code = 2


class ConfigProblems(click.ClickException):
    """Invalid fleet or policy file: every located problem on its own line, exit status 2."""

    exit_code = 2

    def __init__(self, error: ConfigError) -> None:
        super().__init__(str(error))
        self.error = error

    def show(self, file: IO[str] | None = None) -> None:
        """Print one ``Error: file:line:col: code: message`` line per problem to stderr."""
        for problem in self.error.problems:
            click.echo(f"Error: {problem}", err=True)


class CheckFailed(click.ClickException):
    """A check ran and found problems (already printed by the command): exit status 1, with
    ``message`` (when not empty) on stderr as it is, without an ``Error:`` prefix."""

    exit_code = 1

    def __init__(self, message: str = "") -> None:
        super().__init__(message)

    def show(self, file: IO[str] | None = None) -> None:
        """Print the message, if any, to stderr."""
        if self.message:
            click.echo(self.message, err=True)


class BudgetRefused(click.ClickException):
    """A budget refused the request (``NoEligibleTarget.by_budget``; HTTP's 429 ``budget_exhausted``): printed
    as ``Error: budget_exhausted: <message>``, exit status 3."""

    exit_code = 3

    def __init__(self, message: str) -> None:
        super().__init__(f"budget_exhausted: {message}")


def validation_message(exc: ValidationError) -> str:
    """One line for a pydantic ``ValidationError``; for ``Settings``, each bad field as its
    environment variable, e.g. ``POINTSMAN_MAX_BODY_BYTES='abc': Input should be a valid
    integer, ...``."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(x) for x in err.get("loc", ()))
        name = f"POINTSMAN_{loc.upper()}" if exc.title == "Settings" and loc else loc or exc.title
        given = err.get("input")
        value = f"={given!r}" if isinstance(given, (str, int, float)) else ""
        parts.append(f"{name}{value}: {err['msg']}")
    prefix = "invalid setting " if exc.title == "Settings" else f"invalid {exc.title}: "
    return prefix + "; ".join(parts)


def os_error_message(exc: OSError) -> str:
    """One line for a file-system error: ``<path>: <reason>`` (``strerror`` when set)."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


__all__ = ["BudgetRefused", "CheckFailed", "ConfigProblems", "InputError", "os_error_message", "validation_message"]
