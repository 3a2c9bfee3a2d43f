"""The training recipe of the difficulty estimator, as data (``TrainConfig``).

Defaults are the recipe chosen by leave-one-chat-source-out on the licensed chat sets
(``scripts/select_recipe_v2.py``; ``estimator/default_model/PROVENANCE.md`` has the table):

- the two Apache-2.0 chat sources, Arena-Bench-V1 and RouteLLM MT-bench, one unit of weight
  per prompt (the benchmark tables of the v1 mix transfer worse to chat prompts);
- ranking label: the graded gap share (``training.labels.pairwise_gap_share``),
  smoothed to [0.02, 0.98] and shifted in logit space so each source is centered on
  its own mean (``center_sources``);
- head: one logistic regression (L2 alpha 3000) on z-scored embedding ⊕ request features
  ⊕ the conversation block (``estimator.conversation``: the embedding reads earlier user turns
  after the last one), Platt-calibrated on out-of-fold scores against the pairwise "weak
  worse" share with equal weight per source;
- v3: the easy anchors (``datasets.easy_anchors``: requests every chat model answers acceptably,
  label 0) and the head's gate (``estimator.head``: weight 2, shift 2, L2 alpha 100), chosen by
  the sanity suite and leave-one-chat-source-out together (``scripts/select_recipe_v3.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pointsman.datasets.sources import DEFAULT_TRAINING_SOURCES
from pointsman.estimator.conversation import BLOCKS
from pointsman.estimator.manifest import POOLINGS
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
    (``estimator.conversation``: ``rarity``, ``conversation``). ``pooling``: how the embedding pools the
    query (``estimator.manifest.POOLINGS``; ``instruction`` weighs the instruction apart from pasted material,
    ``estimator.head_inputs``).
    ``panel_weight``: share 0-1 of the ranking label taken from the source's panel (many models'
    outcomes on the prompt, ``OutcomeSource.panel``) instead of its own weak × strong pairs: label
    denoising (``training.train.ranking_labels``); sources without a panel keep their label.
    ``warm_start``: licensed sources (``datasets.sources.SOURCES``) trained on beside the given
    ones, together weighing ``warm_start_share`` × the given sources' rows (``rank_weights``); the
    calibration reads the given sources only.
    ``easy_anchors``: add the easy anchors (``datasets.easy_anchors``) as rows labelled 0, which
    the ranker skips and the head's gate learns (``gate_weight`` > 0; ``gate_shift``, ``gate_alpha``:
    ``estimator.head.DifficultyHead``); their total weight in the calibration is one source's.
    """

    encoder: str = "static"
    sources: tuple[str, ...] = DEFAULT_TRAINING_SOURCES
    label: str = "gap"
    label_offsets: str = "center"
    label_clip: float = 0.02
    source_weights: dict[str, float] | None = None
    head: str = "logistic"
    hidden: int = 16
    alpha: float = 3000.0
    n_members: int = 3
    max_iter: int = 200
    n_folds: int = 5
    scale: str = "standard"
    seed: int = 0
    static_max_tokens: int = 512
    minilm_max_tokens: int = 128
    max_rows_per_source: dict[str, int] | None = None
    encoder_from: str | None = None
    blocks: tuple[str, ...] = ("conversation",)
    pooling: str = "instruction"
    panel_weight: float = 0.0
    warm_start: tuple[str, ...] = ()
    warm_start_share: float = 0.0
    easy_anchors: bool = True
    gate_weight: float = 2.0
    gate_shift: float = 2.0
    gate_alpha: float = 100.0
    extra: JSONObject = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got {self.encoder!r}")
        if self.label_offsets not in ("none", "center", "anchor"):
            raise ValueError(f"label_offsets must be none, center or anchor, got {self.label_offsets!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.label not in ("gap", "worse"):
            raise ValueError(f"label must be 'gap' or 'worse', got {self.label!r}")
        self.sources = tuple(self.sources)
        self.blocks = tuple(self.blocks)
        self.warm_start = tuple(self.warm_start)
        if not 0.0 <= self.panel_weight <= 1.0:
            raise ValueError(f"panel_weight must be in [0, 1], got {self.panel_weight}")
        if self.gate_weight < 0.0 or self.gate_alpha <= 0.0:
            raise ValueError(f"gate_weight must be >= 0 and gate_alpha > 0, got {self.gate_weight}, {self.gate_alpha}")
        if self.warm_start_share < 0.0:
            raise ValueError(f"warm_start_share must be >= 0, got {self.warm_start_share}")
        unknown = set(self.blocks) - {name for name, _ in BLOCKS}
        if unknown:
            raise ValueError(f"blocks must be among {', '.join(name for name, _ in BLOCKS)}, got {sorted(unknown)}")

    def params(self) -> JSONObject:
        """Flat parameters for MLflow and the manifest's recipe (tuples comma-joined)."""
        out: JSONObject = {}
        for k, v in asdict(self).items():
            out[k] = ",".join(v) if isinstance(v, tuple) else v
        return out
