"""Records of the decision and outcome log: what one decision stores (``DecisionRecord``),
what a stored outcome reads back as (``LoggedOutcome``, ``LoggedDecision``), the per-item
acknowledgement (``OutcomeAck``), and the privacy-preserving prompt keys (sha256 of the
conversation, the leakage-safe conversation key).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, fields
from functools import cache
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
from numpy.typing import NDArray
from pydantic import TypeAdapter, ValidationError

from pointsman.datasets.splits import group_key
from pointsman.errors import DataError
from pointsman.estimator.estimate import Estimator, HeadInputEstimator
from pointsman.estimator.feature_space import feature_space_of
from pointsman.estimator.features import RequestFeatures
from pointsman.outcome import QualitySignals, Usage
from pointsman.request import RequestView, RouteRequest

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.policy.decision import Decision


#: ``RequestFeatures`` fields kept in the log (all but the text).
#: (``continues`` and ``alone``, a short follow-up's two readings, are derived, not logged.)
FEATURE_FIELDS = tuple(f.name for f in fields(RequestFeatures) if f.name not in ("query_text", "continues", "alone"))
#: The value of a logged request feature (``RequestFeatures``' counts, flags and optional caps).
FeatureValue: TypeAlias = int | bool | None


def _view(request: RouteRequest | RequestView) -> RequestView:
    return request if isinstance(request, RequestView) else RequestView.of(request)


def conversation_text(request: RouteRequest | RequestView) -> str:
    """The conversation as one string (``role: text`` per message, newline-separated), the input of
    ``prompt_sha256``: the request's ``RequestView.transcript``."""
    return _view(request).transcript


def prompt_sha256(request: RouteRequest | RequestView) -> str:
    """sha256 hex (64 chars) of ``conversation_text(request)`` in UTF-8 (``RequestView.prompt_sha256``: hashed
    from the texts' UTF-8 piece by piece, the transcript not built)."""
    return _view(request).prompt_sha256()


def conversation_key(request: RouteRequest | RequestView) -> str:
    """Leakage-safe group key of the conversation (``datasets.splits.group_key``: sha1 prefix of
    the normalized first user text, 16 hex), the same key public-table training splits by. Kept per
    first user text (``_FIRST_TEXT_KEYS``): every turn of a conversation has the same one."""
    view = _view(request)
    first = next((text for m, text in zip(view.request.messages, view.texts) if m.role == "user"), "")
    seen = hashlib.sha256(first.encode("utf-8", "surrogatepass")).digest()
    key = _FIRST_TEXT_KEYS.get(seen)
    if key is None:
        key = group_key([{"role": "user", "content": first}])
        if len(_FIRST_TEXT_KEYS) >= MAX_FIRST_TEXT_KEYS:
            _FIRST_TEXT_KEYS.clear()
        _FIRST_TEXT_KEYS[seen] = key
    return key


#: sha256 of a first user text's UTF-8 -> its ``group_key``: normalising the text (lower-cased, split at
#: whitespace, joined) costs ~30 ns a character in the decision log writer, hashing it ~2 (a 10,000-character
#: first turn: ~0.3 ms against ~18 us). Cleared when it holds ``MAX_FIRST_TEXT_KEYS`` (~0.5 MB).
_FIRST_TEXT_KEYS: dict[bytes, str] = {}
MAX_FIRST_TEXT_KEYS = 4096


@dataclass(frozen=True)
class DecisionRecord:
    """One decision as the log stores it.

    ``time_s``: Unix seconds of the decision. ``request_features``: ``RequestFeatures`` fields
    without the text (``FEATURE_FIELDS``). ``head_input``: the estimator's head input, float32
    (d,), or None (no estimator, or it failed). ``feature_space``: ``feature_space_of(estimator)``.
    ``prompt_text``: the encoder's query window; dropped by the log unless it stores prompts.
    ``prompt_tokens``: the prompt's tokens on the chosen target as its cost counted them (``Decision.prompt_tokens``:
    images, audio and files by the target's rules); None in a record logged before it was kept.
    ``api_key_id``: the name of the API key that routed it (None: authentication off, or logged before it was kept),
    so only that key (or an admin key) reports its outcome when its id no longer verifies (a changed decision key).
    """

    decision_id: str
    time_s: float
    target: str
    model: str
    mode: str
    rule: str
    p_hard: float | None
    difficulty_available: bool
    estimated_cost_usd: float | None
    estimator_version: str | None
    policy_revision: str | None
    fleet_revision: str | None
    request_features: dict[str, FeatureValue]
    prompt_sha256: str
    conversation_key: str
    tenant: str | None = None
    feature_space: str | None = None
    head_input: NDArray[np.float32] | None = None
    prompt_text: str | None = None
    prompt_tokens: int | None = None
    api_key_id: str | None = None

    @classmethod
    def from_decision(
        cls,
        decision: Decision,
        request: RouteRequest | RequestView,
        features: RequestFeatures,
        *,
        head_input: NDArray[np.floating] | None = None,
        feature_space: str | None = None,
        time_s: float | None = None,
    ) -> DecisionRecord:
        """The record of ``decision`` for ``request`` with its ``features`` (``extract_features``).

        ``head_input``: float (d,) or (1, d) head input of the estimator that scored it (None if
        none); ``feature_space``: its id (``feature_space_of``). ``time_s`` defaults to now.
        """
        view = _view(request)
        vec = None
        if head_input is not None:
            vec = np.ascontiguousarray(np.asarray(head_input, dtype=np.float32).reshape(-1))
        return cls(
            decision_id=decision.decision_id,
            time_s=time.time() if time_s is None else float(time_s),
            target=decision.target,
            model=decision.model,
            mode=decision.mode,
            rule=decision.rule,
            p_hard=decision.p_hard,
            difficulty_available=decision.difficulty_available,
            estimated_cost_usd=decision.estimated_cost_usd,
            estimator_version=decision.estimator_version,
            policy_revision=decision.policy_revision,
            fleet_revision=decision.fleet_revision,
            request_features={k: getattr(features, k) for k in FEATURE_FIELDS},
            prompt_sha256=prompt_sha256(view),
            conversation_key=conversation_key(view),
            tenant=view.routing.tenant,
            feature_space=feature_space if vec is not None else None,
            head_input=vec,
            prompt_text=features.query_text,
            prompt_tokens=decision.prompt_tokens,
            api_key_id=view.api_key_id,
        )


@dataclass(frozen=True)
class OutcomeAck:
    """What happened to one reported outcome: ``status`` is ``stored`` (new, durable),
    ``duplicate`` (already stored with the same content; durable), ``conflict`` (already
    stored with different content; unchanged) or ``unknown_decision`` (no such decision in the
    log; not stored). ``message`` explains the last two."""

    outcome_id: str
    decision_id: str
    status: str
    message: str | None = None

    @property
    def ok(self) -> bool:
        """True for ``stored`` and ``duplicate``: the outcome is in the log."""
        return self.status in ("stored", "duplicate")


@dataclass(frozen=True)
class LoggedOutcome:
    """One stored outcome (see ``OutcomeIn`` for the fields); ``received_s``: server time of storage."""

    outcome_id: str
    decision_id: str
    received_s: float
    time_s: float | None
    served_target: str | None
    served_model: str | None
    shadow: bool
    status: str
    error: str | None
    usage: Usage
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_latency_ms: float | None
    quality: QualitySignals
    #: The endpoint that served it (the fleet's id) and the upstream's HTTP status, None when not reported.
    served_endpoint: str | None = None
    upstream_status: int | None = None


@dataclass(frozen=True)
class LoggedDecision(DecisionRecord):
    """A stored decision (the ``DecisionRecord`` fields as read back; ``head_input`` float32
    (d,) or None) with its outcomes, oldest first."""

    outcomes: tuple[LoggedOutcome, ...] = field(default_factory=tuple)

    def features(self) -> RequestFeatures:
        """The logged ``RequestFeatures`` with ``query_text`` = the stored prompt text ('' without it).
        Raises ``DataError`` if the log lacks a field this version of Pointsman needs."""
        known = {f.name for f in fields(RequestFeatures)} - {"continues", "alone"}
        values: dict[str, FeatureValue | str] = {k: v for k, v in self.request_features.items() if k in known}
        values["query_text"] = self.prompt_text or ""
        missing = known - set(values)
        if missing:
            raise DataError(f"decision {self.decision_id}: logged request features lack {', '.join(sorted(missing))}")
        try:
            return _features_adapter().validate_python(values)
        except ValidationError as exc:
            raise DataError(f"decision {self.decision_id}: logged request features are not valid ({exc})") from None


@cache
def _features_adapter() -> TypeAdapter[RequestFeatures]:
    """Builds ``RequestFeatures`` from logged values, checking each field's type (built once)."""
    return TypeAdapter(RequestFeatures)


def decision_record(
    decision: Decision,
    request: RouteRequest,
    estimator: Estimator,
    *,
    features: RequestFeatures | None = None,
    head_input: NDArray[np.floating] | None = None,
    time_s: float | None = None,
) -> DecisionRecord:
    """The record of one decision, not yet appended (``record_decision`` appends it; the service's
    background writer appends many at once with ``OutcomeLog.append_decisions``).

    ``features``/``head_input`` are what the engine computed for the decision (the
    ``RequestFeatures`` and ``DifficultyEstimate.features``); they are also read from the
    decision's ``request_features``/``head_input`` when it carries them (and its
    ``request_view`` of ``request``, so the messages are not read again). Otherwise they are
    recomputed here (``extract_features`` and ``estimator.feature_vector``, which costs one more
    encoder pass). Without a ``feature_vector`` method (``FixedDifficulty``, not a
    ``HeadInputEstimator``) or when the estimate was unavailable, no head input is stored.
    """
    from pointsman.estimator.features import extract_features

    carried = decision.request_view
    view = carried if carried is not None and carried.request is request else RequestView.of(request)
    features = features if features is not None else decision.request_features
    head_input = head_input if head_input is not None else decision.head_input
    if features is None:
        features = extract_features(view, estimator.tokenizer)
    if head_input is None and decision.difficulty_available and isinstance(estimator, HeadInputEstimator):
        try:
            head_input = estimator.feature_vector(features)
        except Exception:  # noqa: BLE001 - logging must never fail a decision; no vector then
            head_input = None
    return DecisionRecord.from_decision(decision, view, features, head_input=head_input,
                                        feature_space=feature_space_of(estimator), time_s=time_s)
