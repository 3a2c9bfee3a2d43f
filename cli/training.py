"""``pointsman train`` and ``pointsman evaluate``: the estimator's command-line side.

Attached to the main group by ``register(group)``. Heavy imports (scikit-learn,
pandas, MLflow, torch) happen inside the commands, so ``pointsman route``/``serve``
start without them. Errors are ``cli.errors.InputError``: one ``Error: ...`` line on stderr,
exit code 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from click.core import ParameterSource

from pointsman.cli.errors import SEED, InputError
from pointsman.cli.training_output import echo_metrics, invoked_command, progress_log
from pointsman.errors import PointsmanError

#: ``train --table``'s label-panel weight, warm-start sources and their share, and its gate's shift: the
#: chat recipe's gate (shift 2) lowers short open prompts a table may label hard, shift 4 only requests that
#: look far more like an easy anchor (docs/retraining.md has the 5-fold numbers on the shared AlpacaEval
#: table and the sanity suite that chose them).
TABLE_PANEL_WEIGHT = 0.5
TABLE_WARM_START = ("arena_bench_v1", "routellm_mtbench")
TABLE_WARM_START_SHARE = 0.5
TABLE_GATE_SHIFT = 4.0


def _split_names(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(n.strip() for v in values for n in v.split(",") if n.strip())



def _folds(value: int) -> int:
    """``--folds``: 0 (no cross-fitting) or 2 and more; one fold has nothing to hold out."""
    if value == 1:
        raise click.BadParameter("1 fold holds nothing out: give 0 (no cross-fitting) or 2 and more")
    return value

@click.command("train")
@click.option("--encoder", type=click.Choice(["static", "minilm"]), default="static", show_default=True,
              help="Text encoder: static (distilled from MiniLM, default) or the MiniLM transformer.")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path),
              help="Write the model directory here (e.g. estimator/default_model).")
@click.option("--no-register", is_flag=True, help="Log the run to MLflow but do not register or move @champion.")
@click.option("--no-mlflow", is_flag=True, help="Skip MLflow entirely (needs --output).")
@click.option("--tables", multiple=True, metavar="NAMES",
              help="Training sources by name (repeat or comma-separate); default: all Apache/MIT sources.")
@click.option("--eval", "evals", multiple=True, metavar="TABLE:WEAK:STRONG",
              help="Also evaluate on a table the model does not train on; recorded under transfer/.")
@click.option("--encoder-from", type=click.Path(file_okay=False, path_type=Path),
              help="Reuse the encoder of this model directory (e.g. estimator/default_model); train only the head.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--max-rows", type=click.IntRange(min=1), default=None, help="Cap prompts per source (quick runs).")
@click.option("--folds", type=click.IntRange(min=0), default=5, show_default=True, callback=lambda ctx, param, v: _folds(v),
              help="Cross-fitting folds (held-out metrics, calibration); 0: none.")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as one JSON object.")
@click.option("--from-table", is_flag=True,
              help="Train on the public outcome tables (the default; see --tables).")
@click.option("--from-outcomes", "from_outcomes", is_flag=False, flag_value="-", default=None, metavar="[LOG]",
              help="Train a challenger from the outcome log (default <data dir>/outcomes.db) on the encoder of "
                   "--encoder-from (default: the serving champion); registered with alias @challenger.")
@click.option("--label-rules", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="With --from-outcomes: YAML label rules (training.outcome_labels).")
@click.option("--no-warm-start", is_flag=True,
              help="With --from-outcomes: train on the logged rows only (by default the licensed chat rows of the "
                   "shipped recipe join them, each weighing 200/(n+200) of a logged row: training.warm_start). "
                   "With --table: the same as --warm-start none.")
@click.option("--table", "table", type=click.Path(path_type=Path),
              help="Train on this wide outcome table (any license; see --license) instead of the public sources.")
@click.option("--weak", "weak", multiple=True, metavar="COLS",
              help="With --table: the cheaper model's column(s) (repeat or comma-separate).")
@click.option("--strong", "strong", multiple=True, metavar="COLS",
              help="With --table: the frontier model's column(s) (repeat or comma-separate).")
@click.option("--license", "license_", default=None, metavar="SPDX",
              help="With --table: the table's data license, recorded in the provenance (default: known for the "
                   "shared tables, else 'unknown').")
@click.option("--panel-weight", type=click.FloatRange(0.0, 1.0), default=None, metavar="W",
              help="With --table: share of each prompt's label taken from the table's other model columns (the "
                   "label panel: how often the many models fall short of the strong ones) instead of the weak × "
                   f"strong pairs alone; default {TABLE_PANEL_WEIGHT}, 0 turns it off.")
@click.option("--warm-start", "warm_start", default=None, metavar="NAMES",
              help="With --table: licensed sources trained on beside the table (comma-separated; default "
                   f"{','.join(TABLE_WARM_START)}; 'none' turns it off).")
@click.option("--warm-start-share", type=click.FloatRange(min=0.0), default=None, metavar="S",
              help=f"With --table: the warm-start rows together weigh S × the table's rows (default {TABLE_WARM_START_SHARE}).")
@click.option("--drafts", type=click.Path(path_type=Path), default=None,
              help="With --table: long CSV of answers (prompt_id, model, output); also train the cascade's verifier "
                   "head on the --weak columns' answers and write it into the model directory "
                   "(training/table_verifier.py; POINTSMAN_VERIFIER=DIR, evaluate --model DIR --drafts).")
def train_cmd(encoder: str, output: Path | None, no_register: bool, no_mlflow: bool, tables: tuple[str, ...],
              evals: tuple[str, ...], encoder_from: Path | None, seed: int, max_rows: int | None, folds: int,
              as_json: bool, from_table: bool, from_outcomes: str | None, label_rules: Path | None,
              no_warm_start: bool, table: Path | None, weak: tuple[str, ...], strong: tuple[str, ...],
              license_: str | None, panel_weight: float | None, warm_start: str | None,
              warm_start_share: float | None, drafts: Path | None) -> None:
    """Train the difficulty estimator on the Apache/MIT outcome tables, evaluate it on
    held-out prompts, export it to ONNX, log it to MLflow and (unless --no-register)
    register it as pointsman-difficulty with alias @champion. With --table, train on one
    wide outcome table of any license (its provenance records the license); with --drafts too,
    also the cascade's verifier head on the weak columns' answers. With
    --from-outcomes, train a challenger from logged outcomes instead (cli/loop.py)."""
    if drafts is not None and table is None:
        raise InputError("--drafts needs --table PATH: the drafts are the weak model's answers to that table's prompts")
    if table is None and (weak or strong or license_ or panel_weight is not None or warm_start is not None
                          or warm_start_share is not None):
        raise InputError("--weak, --strong, --license, --panel-weight and --warm-start(-share) apply to --table only")
    if table is not None and (tables or from_table or from_outcomes is not None):
        raise InputError("--table trains on one table; it takes no --tables, --from-table or --from-outcomes")
    if table is not None and not (_split_names(weak) and _split_names(strong)):
        raise InputError("--table needs --weak COL and --strong COL (the model columns to compare)")
    chose_encoder = click.get_current_context().get_parameter_source("encoder") is not ParameterSource.DEFAULT
    if from_outcomes is not None:
        if from_table or tables or max_rows or evals or chose_encoder:
            raise InputError("--from-outcomes trains on the outcome log, on the encoder of --encoder-from (default: the "
                             "serving champion's); it takes no --from-table, --tables, --max-rows, --eval or --encoder")
        from pointsman.cli.loop import train_from_outcomes

        train_from_outcomes(None if from_outcomes == "-" else Path(from_outcomes),
                            base_spec=None if encoder_from is None else str(encoder_from), label_rules=label_rules,
                            fleet=None, seed=seed, calibration_folds=folds, output=output, use_mlflow=not no_mlflow,
                            register=not no_register, as_json=as_json, warm_start=not no_warm_start)
        return
    if encoder_from is not None and chose_encoder:
        raise InputError("--encoder-from reuses that model's encoder: give --encoder or --encoder-from, not both")
    if label_rules is not None:
        raise InputError("--label-rules applies to --from-outcomes only")
    if no_warm_start and table is None:
        raise InputError("--no-warm-start applies to --from-outcomes and --table only")
    if no_warm_start and warm_start is not None:
        raise InputError("give --no-warm-start or --warm-start NAMES, not both")
    if no_mlflow and output is None:
        raise InputError("--no-mlflow needs --output DIR (otherwise the model would be thrown away)")
    parsed_evals: list[tuple[str, str, str]] = []
    for spec in evals:
        parts = spec.rsplit(":", 2)
        if len(parts) != 3 or not all(parts):
            raise InputError(f"--eval expects TABLE:WEAK:STRONG, got {spec!r}")
        parsed_evals.append((parts[0], parts[1], parts[2]))
    from pointsman.datasets.sources import DEFAULT_TRAINING_SOURCES  # a missing extra: cli.main's Error line
    from pointsman.training.recipe import TrainConfig
    from pointsman.training.train import train
    names = _split_names(tables) or DEFAULT_TRAINING_SOURCES
    panel_w, share = 0.0, 0.0  # the public-sources recipe has neither a label panel nor a warm start
    gate_shift = TrainConfig.gate_shift
    warm: tuple[str, ...] = ()
    try:
        sources = None
        if table is not None:
            from pointsman.training.table_source import table_source

            sources = [table_source(table, _split_names(weak), _split_names(strong), license_)]
            names = (sources[0].name,)
            warm = () if no_warm_start else TABLE_WARM_START if warm_start is None else tuple(
                n for n in _split_names((warm_start,)) if n != "none")
            panel_w = TABLE_PANEL_WEIGHT if panel_weight is None else panel_weight
            share = TABLE_WARM_START_SHARE if warm_start_share is None else warm_start_share
            gate_shift = TABLE_GATE_SHIFT
        cfg = TrainConfig(
            encoder=encoder,
            sources=names,
            seed=seed,
            n_folds=folds,
            encoder_from=str(encoder_from) if encoder_from else None,
            max_rows_per_source={n: max_rows for n in names} if max_rows else None,
            panel_weight=panel_w,
            warm_start=warm,
            warm_start_share=share,
            gate_shift=gate_shift,
        )
        result = train(cfg, output, register=not no_register, use_mlflow=not no_mlflow,
                       evals=parsed_evals, command=invoked_command(), log=progress_log(as_json), sources=sources,
                       drafts=drafts)
    except PointsmanError as exc:
        raise InputError(str(exc)) from None
    echo_metrics(result.metrics, as_json=as_json, width=60, output=output,
                 shown=lambda key: key.endswith(("/apgr", "/auc", "/ece")) or key in ("heldout/chat_apgr", "heldout/ece"))


def _fmt_share(v: float) -> str:
    return f"{100 * v:5.1f}%"


@click.command("evaluate")
@click.option("--table", type=click.Path(path_type=Path),
              help="Wide outcome table (gzip or plain CSV): prompt_id, category, prompt, <model columns>.")
@click.option("--weak", help="Model column of the cheaper model.")
@click.option("--strong", help="Model column of the frontier model.")
@click.option("--pairs", "pairs", metavar="FILE|sanity",
              help="Score a sanity suite instead of a table: JSON Lines of (easy, hard) request pairs; 'sanity' is "
                   "the shipped suite (training/sanity.py). Prints the concordance with its 95% interval.")
@click.option("--model", "model_spec", default="champion", show_default=True,
              help="bundled, champion, models:/NAME@ALIAS, models:/NAME/VERSION or a model directory.")
@click.option("--drafts", type=click.Path(path_type=Path), default=None,
              help="Long CSV of answers (prompt_id, model, output): add the cascade's draft-aware metrics, WEAK's "
                   "answer as the draft (training/draft_eval.py).")
@click.option("--draft-folds", type=click.IntRange(2, 20), default=5, show_default=True,
              help="Cross-validation folds of the verifier head trained for --drafts (with --folds, the same folds "
                   "as the prompt head's instead).")
@click.option("--draft-prefix-tokens", type=click.IntRange(1, 8192), default=None,
              help="With --drafts: verify each draft's first N tokens (4N characters, partial) as early verification "
                   "does (a policy's verify.prefix_tokens), not the whole answer.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--folds", type=click.IntRange(min=2), default=None,
              help="Cross-validate instead: refit the model's head recipe on its features K times, each time "
                   "scoring the prompts of one fold it did not see (for a model trained on this table).")
def evaluate_cmd(table: Path | None, weak: str | None, strong: str | None, pairs: str | None, model_spec: str,
                 drafts: Path | None, draft_folds: int, draft_prefix_tokens: int | None, as_json: bool,
                 folds: int | None) -> None:
    """Score every prompt of TABLE with the difficulty model and print RouteLLM's router
    metrics (APGR, CPT(50%), CPT(80%)) and ROC-AUC for WEAK vs STRONG, next to the
    random router, the prompt-length router and the oracle on the same rows. With --folds K,
    the scores are out-of-fold (K-fold cross-validation of the model's recipe on TABLE). With --drafts, also the cascade's:
    draft_apgr and draft_auc of a verifier reading WEAK's answer (a head in cross-validation,
    and the shipped heuristic) and draft_cpt80, the share paying draft + frontier at CPT(80%);
    a model directory with its own verifier head (train --table --drafts) is scored with that head
    instead (JSON verifier: head, else cv-head);
    with --folds and --drafts, the verifier reads each row's out-of-fold p_hard, in the same folds
    (a head refitted per fold, also for a model with its own head). --draft-prefix-tokens N scores
    each draft's first N tokens instead, as early verification sees them (draft_prefix_tokens).

    With --pairs FILE (or --pairs sanity, the shipped suite), score every (easy, hard) request pair
    instead and print the concordance (share of pairs whose hard request gets the higher p_hard, ties
    half) with its 95% Wilson interval, per category, the approval check and the 10 worst pairs."""
    if pairs is not None:
        if table is not None or weak or strong or drafts is not None or folds is not None:
            raise InputError("--pairs scores a sanity suite; it takes no --table, --weak, --strong, --drafts or --folds")
        from pointsman.cli.sanity import evaluate_pairs

        evaluate_pairs(pairs, model_spec, as_json)
        return
    if table is None or not weak or not strong:
        raise InputError("evaluate needs --table PATH --weak COL --strong COL, or --pairs FILE|sanity")
    if draft_prefix_tokens is not None and drafts is None:
        raise InputError("--draft-prefix-tokens cuts the drafts of --drafts: give --drafts ANSWERS")
    from pointsman.estimator.model_source import load_estimator  # a missing extra: cli.main's Error line
    from pointsman.estimator.verifier import model_verifier
    from pointsman.training.crossval import crossval_report, crossval_scores, trained_on_table
    from pointsman.training.draft_eval import evaluate_drafts
    from pointsman.training.evaluate import evaluate_table
    try:
        est = load_estimator(model_spec, intra_op_threads=2)
        if folds is not None:
            oof = crossval_scores(est, table, weak, strong, folds, calibrated=drafts is not None)
            cv = crossval_report(est, table, weak, strong, oof)
            cv_drafts = {} if drafts is None else dict(evaluate_drafts(est, table, weak, strong, drafts, oof=oof,
                                                                            prefix_tokens=draft_prefix_tokens))
            if as_json:
                click.echo(json.dumps({**cv, **cv_drafts}))
            else:
                click.echo(f"{folds}-fold cross-validation of {cv['model_version']} on {table} ({cv['n']} prompts"
                           f"{_suite_words(cv['sanity_excluded'])})")
                spread = f" ({min(cv['fold_apgr']):.4f}-{max(cv['fold_apgr']):.4f})" if cv["fold_apgr"] else ""
                undefined = (f"; {cv['folds_undefined']} fold(s) left out: the strong model is not better on "
                             "their rows (APGR undefined)") if cv["folds_undefined"] else ""
                click.echo(f"APGR out-of-fold {cv['apgr']:.4f}; per fold {cv['apgr_mean']:.4f} +- {cv['apgr_sd']:.4f}"
                           f"{spread}; AUC {cv['auc']:.4f}{undefined}")
                click.echo(f"random {cv['random_apgr']:.4f}  prompt length {cv['length_apgr']:.4f}  "
                           f"oracle {cv['oracle_apgr']:.4f}")
                if cv_drafts:
                    _echo_cascade(weak, cv_drafts, f"the same {folds} folds, out-of-fold p_hard")
            return
        report = evaluate_table(est, table, weak, strong)
        extra: dict[str, object] = {"in_sample": trained_on_table(est, table)}
        if drafts is not None:
            extra.update(evaluate_drafts(est, table, weak, strong, drafts, folds=draft_folds,
                                         head=model_verifier(est.model_dir), prefix_tokens=draft_prefix_tokens))
    except PointsmanError as exc:
        raise InputError(str(exc)) from None
    if as_json:
        click.echo(json.dumps({**report, **extra}))
        return
    click.echo(f"table   {report['table']}  ({report['n']} of {report['n_rows']} prompts scored"
               f"{_suite_words(report['sanity_excluded'])})")
    click.echo(f"pair    weak {weak}  vs  strong {strong}")
    click.echo(f"model   {report['model_version']}  ({report['model_source']})"
               + ("  in sample: the model trained on this table's rows; --folds K gives held-out numbers"
                  if extra["in_sample"] else ""))
    click.echo("")
    click.echo(f"{'router':8s} {'APGR':>7s} {'CPT(50%)':>9s} {'CPT(80%)':>9s} {'AUC':>7s}")
    click.echo(f"{'model':8s} {report['apgr']:7.4f} {_fmt_share(report['cpt50']):>9s} "
               f"{_fmt_share(report['cpt80']):>9s} {report['auc']:7.4f}")
    click.echo(f"{'random':8s} {report['random_apgr']:7.4f} {_fmt_share(0.5):>9s} {_fmt_share(0.8):>9s} {0.5:7.4f}")
    click.echo(f"{'length':8s} {report['length_apgr']:7.4f}")
    click.echo(f"{'oracle':8s} {report['oracle_apgr']:7.4f} {_fmt_share(report['oracle_cpt50']):>9s} "
               f"{_fmt_share(report['oracle_cpt80']):>9s} {1.0:7.4f}")
    if drafts is not None:
        _echo_cascade(weak, extra, f"{draft_folds}-fold CV")


def _suite_words(n: int) -> str:
    """How many of a table's rows were left out as requests of the sanity suites (none: nothing)."""
    return f"; {n} request{'s' if n != 1 else ''} of the sanity suites left out" if n else ""


def _verifier_words(extra: dict[str, object], how: str) -> str:
    """Which verifier scored the cascade's line: the model's own head (in sample or not), else heads in ``how``."""
    if extra["verifier"] != "head":
        return f"verifier head in {how}"
    return f"the model's verifier head {extra['verifier_version']}" + (
        " (in sample: trained on this table)" if extra["verifier_in_sample"] else "")


def _echo_cascade(weak: str, extra: dict[str, object], how: str) -> None:
    """The cascade's line of ``evaluate --drafts`` (``training.draft_eval.DraftReport``)."""
    click.echo(f"\ncascade (drafts of {weak}, {extra['draft_n']} rows): {_verifier_words(extra, how)} "
               f"APGR {extra['draft_apgr']:.4f} (folds {extra['draft_apgr_mean']:.3f} ± {extra['draft_apgr_std']:.3f}), "
               f"AUC {extra['draft_auc']:.4f}, paying draft + frontier at CPT(80%) "
               f"{_fmt_share(float(str(extra['draft_cpt80'])))}; "
               f"shipped heuristic APGR {extra['draft_heuristic_apgr']:.4f}"
               + (f"; {extra['draft_folds_undefined']} fold(s) left out (APGR undefined on their rows)"
                  if extra.get("draft_folds_undefined") else ""))


def register(group: click.Group) -> None:
    """Attach ``train`` and ``evaluate`` to the ``pointsman`` command group."""
    group.add_command(train_cmd)
    group.add_command(evaluate_cmd)
