"""The training recipe of the difficulty estimator, as data (``TrainConfig``).

Defaults are the recipe chosen by held-out validation on the Apache/MIT sets (see
``estimator/default_model/PROVENANCE.md`` for how and on what evidence):

- all six Apache/MIT outcome sources, one unit of weight per prompt (MMLU's 14k
  prompts dominate; on held-out Arena-Bench and MT-bench prompts this beat equal or
  square-root source weights);
- ranking label: the graded gap share (``training.labels.pairwise_gap_share``),
  smoothed to [0.02, 0.98] and shifted in logit space so each source is centered on
  its own mean (``center_sources``): only the *within*-source variation, not which
  model pair a source happened to use, drives the ranking;
- head: soft-voting ensemble of 3 one-layer MLPs (16 units, L2 alpha 10) on
  embedding ⊕ request features, Platt-calibrated on out-of-fold scores against the
  pairwise "weak worse" share with equal weight per source.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pointsman.datasets.sources import DEFAULT_TRAINING_SOURCES
from pointsman.estimator.conversation import BLOCKS
from pointsman.json_types import JSONObject

ENCODERS = ("static", "minilm")


@dataclass
class TrainConfig:
    """One training run's settings.

    ``encoder``: ``static`` or ``minilm``. ``sources``: outcome source names
    (``datasets.sources.SOURCES``). ``label``: ranking target, ``gap`` (graded) or
    ``worse`` (pairwise worse share). ``label_offsets``: how sources are lined up in
    logit space: ``none`` (raw labels), ``center`` (each source centered on its own mean:
    only within-source variation), ``anchor`` (each source centered on its anchor
    model's rate, see ``OutcomeSource.anchor``). ``source_weights``: total weight per source (``None`` = one per prompt).
    ``max_rows_per_source``: cap rows per source (deterministic subset; smoke tests).
    ``static_max_tokens``/``minilm_max_tokens``: encoder token windows.
    ``encoder_from``: reuse the encoder of this model directory instead of building one
    (its kind overrides ``encoder``). ``blocks``: optional head-input blocks
    (``estimator.conversation``: ``rarity``, ``conversation``).
    """

    encoder: str = "static"
    sources: tuple[str, ...] = DEFAULT_TRAINING_SOURCES
    label: str = "gap"
    label_offsets: str = "center"
    label_clip: float = 0.02
    source_weights: dict[str, float] | None = None
    head: str = "mlp"
    hidden: int = 16
    alpha: float = 10.0
    n_members: int = 3
    max_iter: int = 200
    n_folds: int = 5
    scale: str = "blocks"
    seed: int = 0
    static_max_tokens: int = 512
    minilm_max_tokens: int = 128
    max_rows_per_source: dict[str, int] | None = None
    encoder_from: str | None = None
    blocks: tuple[str, ...] = ()
    extra: JSONObject = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got {self.encoder!r}")
        if self.label_offsets not in ("none", "center", "anchor"):
            raise ValueError(f"label_offsets must be none, center or anchor, got {self.label_offsets!r}")
        if self.label not in ("gap", "worse"):
            raise ValueError(f"label must be 'gap' or 'worse', got {self.label!r}")
        self.sources = tuple(self.sources)
        self.blocks = tuple(self.blocks)
        unknown = set(self.blocks) - {name for name, _ in BLOCKS}
        if unknown:
            raise ValueError(f"blocks must be among {', '.join(name for name, _ in BLOCKS)}, got {sorted(unknown)}")

    def params(self) -> JSONObject:
        """Flat parameters for MLflow and the manifest's recipe (tuples comma-joined)."""
        out: JSONObject = {}
        for k, v in asdict(self).items():
            out[k] = ",".join(v) if isinstance(v, tuple) else v
        return out
