"""``p_hard`` labels from logged quality signals: a documented, configurable rule.

``p_hard`` is the probability that the cheaper tier's answer is worse than the frontier
tier's. A logged decision has outcomes (``outcome_log``), each served by a fleet
target: the *strong* tier (by default every target of kind ``frontier`` in the fleet the decision was made on,
kept in the log per fleet revision; today's fleet for a revision it did not keep) or
the *weak* tier (every other target). The label of a decision comes from the first
signal in ``LabelRules.signals`` that has data (``label_decision``):

==================  ==========================================================================
signal              label ``y`` in [0, 1] (the weak tier fell short)
==================  ==========================================================================
``judge_pair``      weak and strong outcomes both carry a ``judge_score`` from the same judge:
                    the share of (weak, strong) pairs with ``strong - weak > judge_margin``
                    (``training.labels.pairwise_worse_share``; with ``judge_graded``, the mean
                    gap ``clip((strong - weak) / judge_scale, 0, 1)``). Several weak outcomes
                    (shadow traffic of several on-prem models) give a soft label.
``judge_reference`` weak outcomes carry ``judge_score`` and ``judge_reference_score`` (the same
                    judge's score of a frontier reference answer): the share with
                    ``reference - score > judge_margin`` (graded as above).
``judge_pass``      weak outcomes carry ``judge_score`` and ``judge_pass_score`` is set: the share
                    scoring below it.
``escalated``       weak outcomes report ``escalated``: ``escalated_label`` for each escalated
                    one, 0 for each one explicitly not escalated; the mean.
``regenerated``     the same with ``regenerated`` and ``regenerated_label``.
``user_rating``     weak outcomes carry ``user_rating`` (0-1): the mean of ``1 - rating``.
``error``           weak outcomes failed (status other than ``ok``) and ``error_label`` is set
                    (default: errors are ignored, they are mostly infrastructure).
==================  ==========================================================================

Decisions whose outcomes give no label (e.g. only a frontier answer with a user rating) are
left out. Each label also carries the scores that APGR weighs (``weak_score``,
``strong_score``): the tiers' mean judge scores for the judge signals, and ``1 - y`` vs 1
otherwise (the gap is the label). ``use_shadow`` (default true) lets shadow outcomes
(answers produced for evaluation, never shown to the user) count; ``weak_models`` /
``strong_models`` keep only outcomes of those upstream models (``served_model``).

Rules are data: ``LabelRules()`` holds the defaults, ``load_label_rules(path)`` reads a
YAML file with any subset of the fields (unknown keys are errors).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pointsman.errors import DataError
from pointsman.training.labels import pairwise_gap_share, pairwise_worse_share

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.outcome_log.records import LoggedDecision, LoggedOutcome
    from pointsman.policy.fleet import Fleet

Signal = Literal["judge_pair", "judge_reference", "judge_pass", "escalated", "regenerated", "user_rating", "error"]
SIGNALS: tuple[Signal, ...] = ("judge_pair", "judge_reference", "judge_pass", "escalated", "regenerated",
                               "user_rating", "error")


class LabelRules(BaseModel):
    """How logged quality signals become ``p_hard`` labels (see the module docstring).

    ``strong_targets``: fleet targets counted as the frontier tier (None: every target of kind
    ``frontier`` in the fleet). ``signals``: the signals to use, in priority order.
    ``judge_margin``: a judge gap counts only above it (same units as the judge's scores).
    ``judge_graded``/``judge_scale``: graded gap share (scale = the judge's score range, e.g. 9
    for 1-10 ratings, 1 for 0-1 scores) instead of the 0/1 "worse" share. ``judge_pass_score``:
    absolute pass mark for ``judge_pass``. ``escalated_label``/``regenerated_label``/``error_label``:
    the label such an outcome gives (``error_label`` None = errors ignored). ``use_shadow``: count
    shadow outcomes. ``weak_models``/``strong_models``: keep only these ``served_model`` values.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    strong_targets: tuple[str, ...] | None = None
    signals: tuple[Signal, ...] = SIGNALS
    judge_margin: float = Field(default=0.0, ge=0.0)
    judge_graded: bool = False
    judge_scale: float = Field(default=1.0, gt=0.0)
    judge_pass_score: float | None = None
    escalated_label: float = Field(default=1.0, ge=0.0, le=1.0)
    regenerated_label: float = Field(default=1.0, ge=0.0, le=1.0)
    error_label: float | None = Field(default=None, ge=0.0, le=1.0)
    use_shadow: bool = True
    weak_models: tuple[str, ...] | None = None
    strong_models: tuple[str, ...] | None = None

    def strong_tier(self, fleet: Fleet | None, kinds: Mapping[str, Mapping[str, str]] | None = None) -> StrongTier:
        """Which targets are the strong tier for each decision: ``strong_targets`` for all; else the targets of kind
        ``frontier`` in the fleet the decision was made on (``kinds``: ``{fleet_revision: {target: kind}}``,
        ``OutcomeLog.fleet_kinds()``), ``fleet`` (today's) for a revision not there. Raises ``DataError`` when neither
        ``strong_targets`` nor ``fleet`` is given."""
        if self.strong_targets is not None:
            return StrongTier(frozenset(self.strong_targets), None)
        if fleet is None:
            raise DataError("label rules need strong_targets or a fleet to tell the frontier tier apart")
        today = frozenset(name for name, t in fleet.targets.items() if t.kind == "frontier")
        by_revision = {rev: frozenset(t for t, kind in k.items() if kind == "frontier") for rev, k in (kinds or {}).items()}
        return StrongTier(today, by_revision)


class StrongTier:
    """The strong-tier target names of each logged decision (``LabelRules.strong_tier``): ``of(decision)`` reads
    them from ``by_revision`` by the decision's ``fleet_revision``, else ``today`` (for every decision when
    ``by_revision`` is None: the rules name the targets); ``fell_back`` holds the ids of the decisions whose
    revision was not kept (a log written before fleet revisions were), labelled by ``today``."""

    def __init__(self, today: frozenset[str], by_revision: Mapping[str, frozenset[str]] | None) -> None:
        self.today = today
        self.by_revision = by_revision
        self.fell_back: set[str] = set()

    def of(self, decision: LoggedDecision) -> frozenset[str]:
        """The strong-tier targets of ``decision``."""
        if self.by_revision is None:
            return self.today
        got = self.by_revision.get(decision.fleet_revision or "")
        if got is None:
            self.fell_back.add(decision.decision_id)
            return self.today
        return got


def load_label_rules(path: str | Path | None) -> LabelRules:
    """``LabelRules`` from a YAML mapping of field overrides (None: the defaults). Raises
    ``DataError`` naming the file and the offending field (unknown keys included)."""
    if path is None:
        return LabelRules()
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise DataError(f"{path}: cannot read label rules ({exc})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: label rules must be a mapping of fields, got {type(data).__name__}")
    try:
        return LabelRules.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        known = ", ".join(LabelRules.model_fields)
        raise DataError(f"{path}: {where}: {msg} (label rule fields: {known})") from None


class OutcomeLabel(BaseModel):
    """The label of one decision: ``y`` in [0, 1], the tier scores APGR weighs
    (``strong_score - weak_score`` is the gap), the ``signal`` that decided and ``n`` (pairs or
    outcomes behind it)."""

    model_config = ConfigDict(frozen=True)

    y: float
    weak_score: float
    strong_score: float
    signal: str
    n: int


def _split(decision: LoggedDecision, rules: LabelRules, strong: frozenset[str]
           ) -> tuple[list[LoggedOutcome], list[LoggedOutcome]]:
    weak_side, strong_side = [], []
    for o in decision.outcomes:
        if o.shadow and not rules.use_shadow:
            continue
        target = o.served_target or decision.target
        if target in strong:
            if rules.strong_models is None or o.served_model in rules.strong_models:
                strong_side.append(o)
        elif rules.weak_models is None or o.served_model in rules.weak_models:
            weak_side.append(o)
    return weak_side, strong_side


def _judge_pair(weak: list[LoggedOutcome], strong: list[LoggedOutcome], rules: LabelRules) -> OutcomeLabel | None:
    judges = {o.quality.judge for o in weak if o.status == "ok" and o.quality.judge_score is not None}
    best = None
    for judge in sorted(judges, key=str):
        w = np.array([o.quality.judge_score for o in weak
                      if o.status == "ok" and o.quality.judge_score is not None and o.quality.judge == judge])
        s = np.array([o.quality.judge_score for o in strong
                      if o.status == "ok" and o.quality.judge_score is not None and o.quality.judge == judge])
        if len(w) == 0 or len(s) == 0:
            continue
        if rules.judge_graded:
            y, n = pairwise_gap_share(w[None, :], s[None, :], rules.judge_scale)
        else:
            y, n = pairwise_worse_share(w[None, :], s[None, :], rules.judge_margin)
        label = OutcomeLabel(y=float(y[0]), weak_score=float(w.mean()), strong_score=float(s.mean()),
                             signal="judge_pair", n=int(n[0]))
        if best is None or label.n > best.n:
            best = label
    return best


def _judge_reference(weak: list[LoggedOutcome], rules: LabelRules) -> OutcomeLabel | None:
    pairs = [(o.quality.judge_score, o.quality.judge_reference_score) for o in weak
             if o.status == "ok" and o.quality.judge_score is not None and o.quality.judge_reference_score is not None]
    if not pairs:
        return None
    w, s = np.array(pairs, dtype=np.float64).T
    if rules.judge_graded:
        y = float(np.clip((s - w) / rules.judge_scale, 0.0, 1.0).mean())
    else:
        y = float(((s - w) > rules.judge_margin).mean())
    return OutcomeLabel(y=y, weak_score=float(w.mean()), strong_score=float(s.mean()), signal="judge_reference",
                        n=len(pairs))


def _shares(values: Sequence[float], signal: str) -> OutcomeLabel | None:
    if not values:
        return None
    y = float(np.mean(values))
    return OutcomeLabel(y=y, weak_score=1.0 - y, strong_score=1.0, signal=signal, n=len(values))


def label_decision(decision: LoggedDecision, rules: LabelRules, strong_targets: frozenset[str]) -> OutcomeLabel | None:
    """The label of one logged decision by ``rules`` (first signal in ``rules.signals`` with
    data), or None when its outcomes carry no usable signal. ``strong_targets``: the strong-tier
    target names (``rules.strong_tier(fleet, kinds).of(decision)``)."""
    weak, strong = _split(decision, rules, strong_targets)
    if not weak:
        return None
    ok = [o for o in weak if o.status == "ok"]
    for signal in rules.signals:
        label: OutcomeLabel | None = None
        if signal == "judge_pair":
            label = _judge_pair(weak, strong, rules)
        elif signal == "judge_reference":
            label = _judge_reference(weak, rules)
        elif signal == "judge_pass" and rules.judge_pass_score is not None:
            label = _shares([float(o.quality.judge_score < rules.judge_pass_score) for o in ok
                             if o.quality.judge_score is not None], signal)
        elif signal == "escalated":
            label = _shares([rules.escalated_label if o.quality.escalated else 0.0 for o in weak
                             if o.quality.escalated is not None], signal)
        elif signal == "regenerated":
            label = _shares([rules.regenerated_label if o.quality.regenerated else 0.0 for o in weak
                             if o.quality.regenerated is not None], signal)
        elif signal == "user_rating":
            label = _shares([1.0 - o.quality.user_rating for o in ok if o.quality.user_rating is not None], signal)
        elif signal == "error" and rules.error_label is not None:
            label = _shares([rules.error_label for o in weak if o.status != "ok"], signal)
        if label is not None:
            return label
    return None


def rules_as_params(rules: LabelRules) -> dict[str, object]:
    """The rules as flat MLflow parameters (``label.<field>``, lists comma-joined)."""
    out: dict[str, object] = {}
    for k, v in rules.model_dump().items():
        out[f"label.{k}"] = ",".join(v) if isinstance(v, (list, tuple)) else v
    return out
