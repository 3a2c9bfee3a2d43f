"""``pointsman evaluate --pairs FILE|sanity``: the sanity suite on the command line (``training.sanity``).

Prints the concordance with its 95% Wilson interval next to the prompt-length baseline, per
category, the approval check and the 10 worst pairs; ``--json`` prints ``SanityReport.to_dict()``.
Bad input: one ``Error: file:line: field '...': ...`` line, exit status 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from pointsman.cli.errors import InputError
from pointsman.errors import PointsmanError


def evaluate_pairs(pairs: str, model_spec: str, as_json: bool) -> None:
    """Score ``pairs`` (a file or ``sanity``) with the model of ``model_spec`` and print the report."""
    from pointsman.training.sanity import APPROVAL_TOLERANCE, concordance, read_pairs, shipped_pairs_path

    try:
        report = concordance(model_spec, read_pairs(pairs))  # a bad file fails before a model is loaded
    except PointsmanError as exc:
        raise InputError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report.to_dict()))
        return
    lo, hi = report.ci95
    wins = sum(p.credit == 1.0 for p in report.pairs)
    chosen_on = Path(report.pairs_file).resolve() == shipped_pairs_path().resolve()
    click.echo(f"pairs   {report.pairs_file}  ({report.n} pairs, never trained on"
               + ("; the shipped recipe was chosen on them: datasets/sanity_holdout_pairs.jsonl was not)"
                  if chosen_on else ")"))
    click.echo(f"model   {report.model_version}  ({report.model_source})")
    click.echo("")
    click.echo(f"concordance {report.concordance:.4f}  95% CI {lo:.4f}-{hi:.4f} (Wilson)  "
               f"p_hard(hard) > p_hard(easy) in {wins} of {report.n} pairs, {report.ties} ties (count half)")
    click.echo(f"baselines   random 0.5000  prompt length {report.length_concordance:.4f}")
    click.echo("")
    click.echo(f"{'category':14s} {'pairs':>5s} {'concordance':>11s}")
    for name, cat in report.per_category.items():
        click.echo(f"{name:14s} {cat.n:5d} {cat.concordance:11.4f}")
    click.echo("")
    if report.approvals:
        click.echo(f"approval: {report.approvals_ok} of {len(report.approvals)} conversations ending in a short "
                   f"approval score within {APPROVAL_TOLERANCE:g} of the request they approve, alone")
        for a in report.worst_approvals():
            if not a.ok:
                click.echo(f"  {a.id:20s} conversation {a.p_conversation:.4f}  request alone {a.p_request:.4f}  "
                           f"({a.difference:+.4f})")
    else:
        click.echo("approval: no conversation ends in a short approval")
    click.echo("")
    click.echo("worst pairs (p_hard(easy) - p_hard(hard), largest first):")
    click.echo(f"  {'id':20s} {'category':14s} {'p_easy':>7s} {'p_hard':>7s} {'gap':>7s}")
    for p in report.worst():
        click.echo(f"  {p.id:20s} {p.category:14s} {p.p_easy:7.4f} {p.p_hard:7.4f} {p.inversion:+7.4f}")
