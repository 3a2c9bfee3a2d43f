"""``pointsman train-verifier``: train the cascade's verifier head and write it as a directory
``POINTSMAN_VERIFIER`` serves (``training/verifier.py``).

From a table with drafts (``--table T --weak W --strong S --drafts D``: W's answers are the
drafts, the difficulty model's ``p_hard`` a feature) or from the outcome log
(``--from-outcomes LOG``: verified drafts with labelled outcomes). ``--license`` records the
training data's licence in the head's provenance; a non-commercial one (AlpacaEval is CC
BY-NC) marks the head ``evaluation only``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from pointsman.cli.errors import InputError
from pointsman.errors import PointsmanError


@click.command("train-verifier")
@click.option("--table", type=click.Path(path_type=Path), help="Wide outcome table (with --weak, --strong, --drafts).")
@click.option("--weak", help="Model column whose answers are the drafts.")
@click.option("--strong", help="Model column of the frontier model.")
@click.option("--drafts", type=click.Path(path_type=Path), help="Long CSV of answers: prompt_id, model, output.")
@click.option("--from-outcomes", "from_outcomes", type=click.Path(path_type=Path),
              help="Train on the outcome log's verified drafts with labelled outcomes instead (the frontier "
                   "targets of the fleet, POINTSMAN_FLEET_PATH, are the strong tier).")
@click.option("--model", "model_spec", default="bundled", show_default=True, help="Difficulty model for p_hard.")
@click.option("--license", "license_", default="unknown", show_default=True,
              help="Licence of the training data (recorded; 'CC-BY-NC' etc. mark the head evaluation only).")
@click.option("--output", required=True, type=click.Path(path_type=Path), help="Directory to write the head into.")
def train_verifier_cmd(table: Path | None, weak: str | None, strong: str | None, drafts: Path | None,
                       from_outcomes: Path | None, model_spec: str, license_: str, output: Path) -> None:
    """Train the cascade's verifier head (a scaled logistic regression over the draft features)
    and write verifier.onnx + verifier.json into OUTPUT."""
    from pointsman.training.verifier import export_verifier, fit_verifier, logged_examples, verifier_use

    try:
        if from_outcomes is not None:
            if table or drafts:
                raise InputError("--from-outcomes trains on the outcome log; it takes no --table or --drafts")
            from pointsman.outcome_log.store import OutcomeLog
            from pointsman.policy.fleet import load_fleet
            from pointsman.service.settings import Settings

            with OutcomeLog(from_outcomes) as log:  # the fleet's frontier targets are the strong tier
                x, y = logged_examples(log, load_fleet(Settings().fleet_path))
            source: dict[str, object] = {"outcome_log": str(from_outcomes)}
        else:
            if not (table and weak and strong and drafts):
                raise InputError("give --table, --weak, --strong and --drafts, or --from-outcomes")
            from pointsman.estimator.model_source import load_estimator
            from pointsman.training.draft_eval import draft_matrix
            from pointsman.training.metrics import weak_worse

            x, w, s, _, _ = draft_matrix(load_estimator(model_spec), table, weak, strong, drafts)
            y = weak_worse(w, s)
            source = {"table": str(table), "weak": weak, "strong": strong, "drafts": str(drafts)}
        head = fit_verifier(x, y)
    except PointsmanError as exc:
        raise InputError(str(exc)) from None
    except ValueError as exc:
        raise InputError(str(exc)) from None
    provenance = {**source, "license": license_, "rows": int(len(y)), "positives": int(y.sum()),
                  "use": verifier_use(license_)}
    export_verifier(head, output, provenance)
    click.echo(json.dumps({"output": str(output), **provenance}))


def register(group: click.Group) -> None:
    """Attach ``train-verifier`` to the ``pointsman`` command group."""
    group.add_command(train_verifier_cmd)
