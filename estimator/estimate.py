"""What any difficulty estimator returns, and the protocols the engine and the log rely on.

The onnxruntime ``DifficultyEstimator`` (``estimator/difficulty.py``) is the real
one; ``FixedDifficulty`` is a static stand-in for tests, replay and policy cases.

Protocols, from what every estimator has to what some offer:

- ``Estimator``: ``version``, ``tokenizer``, ``estimate(features)`` (the engine's seam);
- ``TokenIdsEstimator``: also ``takes_query_token_ids`` and ``estimate(features,
  query_token_ids)``, so the engine tokenizes the query window once;
- ``HeadInputEstimator``: also ``feature_vector(features)`` (the head's input, float32 (d,)),
  so the decision log can store it when an estimate did not carry one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Tokenizer

    from pointsman.estimator.features import RequestFeatures


@dataclass(frozen=True)
class DifficultyEstimate:
    """The estimator's answer for one request.

    ``p_hard``: calibrated probability in [0, 1] that the cheaper model's answer is
    worse than the frontier model's; ``None`` when ``available`` is False.
    ``latency_ms``: wall time spent estimating, in milliseconds.
    ``error``: why the estimate is unavailable (exception text or "timeout"), else None.
    ``features``: the head's input for this request, float32 array (d,) (embedding ⊕ request
    features), when the estimator computed one (also on a timeout), else None; the outcome
    log stores it so a new head can be trained without the prompt text.
    ``reading``: which reading of the request ``p_hard`` is: ``request`` (the request as it is),
    or for a short follow-up (``RequestFeatures.continues``) the larger of ``continued`` (the
    request it continues) and ``alone`` (the follow-up read alone); ``whole`` when the request (or
    the one continued) has a short instruction that may be a preamble and its query read as one mean
    scored higher (``estimator.head_inputs.short_instruction``).
    """

    p_hard: float | None
    available: bool
    latency_ms: float
    error: str | None = None
    features: NDArray[np.float32] | None = field(default=None, repr=False, compare=False)
    reading: str = "request"


@runtime_checkable
class Estimator(Protocol):
    """Anything that turns request features into a ``DifficultyEstimate``.

    ``version``: a string naming the model (registry name/version or content hash).
    ``tokenizer``: the tokenizer used for counting prompt tokens, or None.
    ``estimate`` never raises for a valid ``RequestFeatures``: failures come back as
    ``available=False`` with ``error`` set.

    Optional: an estimator whose ``takes_query_token_ids`` is true also accepts
    ``estimate(features, query_token_ids)``, the ids of ``features.query_text`` from its own
    ``tokenizer`` without special tokens (``features.tokenized_features``), and then does not
    tokenize the query again.
    """

    @property
    def version(self) -> str:
        """The model's name and version."""
        ...

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer prompt tokens are counted with, or None (characters per token)."""
        ...

    def estimate(self, features: RequestFeatures) -> DifficultyEstimate:
        """The difficulty of one request; never raises (failure = ``available=False``)."""
        ...


@runtime_checkable
class TokenIdsEstimator(Estimator, Protocol):
    """An ``Estimator`` that can take the query window's token ids (see ``Estimator``); the
    engine passes them when ``takes_query_token_ids`` is true."""

    @property
    def takes_query_token_ids(self) -> bool:
        """Whether ``estimate`` uses ``query_token_ids`` (its tokenizer splits words locally)."""
        ...

    def estimate(self, features: RequestFeatures, query_token_ids: list[int] | None = None) -> DifficultyEstimate:
        """The difficulty of one request, from the ids of ``features.query_text`` when given."""
        ...


@runtime_checkable
class HeadInputEstimator(Estimator, Protocol):
    """An ``Estimator`` that exposes its head's input vector for a request."""

    def feature_vector(self, features: RequestFeatures) -> NDArray[np.float32]:
        """The head input (embedding ⊕ request features) of one request: float32 (d,)."""
        ...


@dataclass
class FixedDifficulty:
    """An estimator that returns the same ``p_hard`` for every request (tests, replay, cases).

    ``p_hard=None`` models an unavailable estimator.
    """

    p_hard: float | None = 0.5
    version: str = "fixed"
    tokenizer: None = None

    def estimate(self, features: RequestFeatures) -> DifficultyEstimate:
        """Return the fixed estimate; ``available`` is False when ``p_hard`` is None."""
        if self.p_hard is None:
            return DifficultyEstimate(None, False, 0.0, "estimator unavailable (fixed)")
        return DifficultyEstimate(float(self.p_hard), True, 0.0)
