"""Verifiers: draft features in, ``p_bad`` out (the probability that the draft loses to the
frontier model's answer), for ``POST /v1/verify`` and the policy's ``verify`` rules.

- ``HeuristicVerifier`` (the shipped default) is **a documented heuristic, not a trained
  model**: a logistic score with hand-set weights (below), so it carries no data licence.
  Its directions come from the issue-16 study of the shared AlpacaEval answers (a short
  answer predicts a loss with AUC 0.73; refusals lose), but its weights were set by hand
  and it is not calibrated on any table: treat ``p_bad`` as a ranking until a trained head
  replaces it. A partial draft's length reads as ``PREFIX_REFERENCE_TOKENS`` (v2; v1 read every
  prefix as a short answer).
- ``OnnxVerifier`` loads a trained head (``verifier.onnx``, a calibrated scikit-learn
  classifier exported by ``training/verifier.py``; input ``features`` float32 ``(n,
  len(FEATURE_NAMES))``, output ``probabilities`` ``(n, 2)``) from a directory with a
  ``verifier.json`` naming its version, features and training data.

``load_verifier(spec)``: ``None``/``"heuristic"`` -> ``HeuristicVerifier``; a directory ->
``OnnxVerifier``. Raises ``ModelNotFoundError`` for a directory without a valid head.
``model_verifier(model_dir)``: the head a difficulty model directory carries beside its own
files (``pointsman train --table --drafts`` writes ``VERIFIER_FILES`` there, so the same
directory serves as ``POINTSMAN_VERIFIER``), or None when it carries none.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from pointsman.errors import ModelNotFoundError
from pointsman.estimator.draft import FEATURE_NAMES, DraftFeatures

#: Hand-set weights of the heuristic, on ``DraftFeatures.vector()`` (logit units per unit).
HEURISTIC_WEIGHTS: dict[str, float] = {
    "log_tokens": -0.6,        # each e-fold longer answer: less likely to lose (length AUC 0.73 in the study)
    "log_length_ratio": 0.0,
    "empty": 5.0,              # nothing came back
    "truncated": 1.2,          # cut at the output cap
    "partial": 0.0,
    "refusal": 2.0,            # "I'm sorry, I cannot ..." on a prompt that was routed to be answered
    "hedging": 0.7,
    "repetition": 3.0,         # a looping answer (share of repeated trigrams)
    "has_logprobs": -0.75,     # centres the two terms below on a typical answer (mean -0.4, 10% low)
    "logprob_mean": -1.5,      # a less confident answer (mean log-probability further below 0)
    "logprob_min": 0.0,
    "low_logprob_share": 1.5,
    "p_hard": 2.5,             # the prompt's own difficulty
    "log_caveats": 0.0,        # added for trained heads; the heuristic's weights predate them
    "log_list_items": 0.0,
    "opening_overlap": 0.0,    # likewise (a trained head's input; the heuristic stays heuristic-v2)
}
#: Bias: a 150-token, unremarkable answer to a p_hard 0.5 prompt scores about 0.3.
HEURISTIC_BIAS = 0.6 * math.log1p(150) - 2.5 * 0.5 - 0.85
HEURISTIC_VERSION = "heuristic-v2"
#: The length a partial draft's ``log_tokens`` reads as (the bias's typical answer). Without it the
#: length weight took every prefix for a short answer: on AlpacaEval 1.0 (llama-2-7b-chat) p_bad >= 0.6
#: for 56.5% of 16-token prefixes against 9.9% of whole drafts; with it 3.5%, 5.5%, 7.5% and 10.4% at
#: 16, 32, 64 and 128 tokens, the ranking (APGR) within 0.007 (docs/cascade.md, "Early verification").
PREFIX_REFERENCE_TOKENS = 150
_PARTIAL, _LOG_TOKENS = FEATURE_NAMES.index("partial"), FEATURE_NAMES.index("log_tokens")
#: A trained head's files in its directory: the ONNX graph and its metadata (version, features, provenance).
VERIFIER_FILES = ("verifier.onnx", "verifier.json")


@runtime_checkable
class Verifier(Protocol):
    """Anything that scores a draft. ``version``: a name for traces and the outcome log;
    ``p_bad(features)``: probability in [0, 1] that the draft is worse than the frontier's
    answer. Never raises for valid ``DraftFeatures``."""

    @property
    def version(self) -> str:
        """The verifier's name and version."""
        ...

    def p_bad(self, features: DraftFeatures) -> float:
        """Probability in [0, 1] that the draft loses to the frontier's answer."""
        ...


class HeuristicVerifier:
    """The shipped default: ``sigmoid(HEURISTIC_BIAS + sum(w_i x_i))`` over
    ``HEURISTIC_WEIGHTS`` (see the module: hand-set, not trained, not calibrated)."""

    version = HEURISTIC_VERSION

    def __init__(self) -> None:
        self._w = np.array([HEURISTIC_WEIGHTS[n] for n in FEATURE_NAMES], dtype=np.float64)

    def p_bad(self, features: DraftFeatures) -> float:
        """The heuristic score of one draft, in (0, 1)."""
        return self.p_bad_vector(features.vector())

    def p_bad_vector(self, x: np.ndarray) -> float:
        """The heuristic score of one ``DraftFeatures.vector()`` (``len(FEATURE_NAMES)``,), in (0, 1).
        A partial draft (early verification) reads its length as ``PREFIX_REFERENCE_TOKENS``: the first
        N tokens say nothing about the answer's final length."""
        v = np.array(x, dtype=np.float64)
        if v[_PARTIAL] > 0.5:
            v[_LOG_TOKENS] = math.log1p(PREFIX_REFERENCE_TOKENS)
        z = HEURISTIC_BIAS + float(self._w @ v)
        return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))


class OnnxVerifier:
    """A trained head in ONNX (see the module). ``OnnxVerifier(directory)`` raises
    ``ModelNotFoundError`` when ``verifier.onnx``/``verifier.json`` are missing or unreadable or
    the head's features are not ``FEATURE_NAMES``."""

    def __init__(self, directory: str | Path) -> None:
        import onnxruntime as ort

        d = Path(directory)
        try:
            meta = json.loads((d / VERIFIER_FILES[1]).read_text(encoding="utf-8"))
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            self._session = ort.InferenceSession(str(d / VERIFIER_FILES[0]), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types for corrupt files
            raise ModelNotFoundError(f"no verifier head in {d}: {exc}") from None
        if not isinstance(meta, dict) or list(meta.get("features", [])) != list(FEATURE_NAMES):
            raise ModelNotFoundError(f"verifier head in {d} was trained on other features than {FEATURE_NAMES}: "
                                     "retrain it with this version (pointsman train --table ... --drafts, or "
                                     "pointsman train-verifier)")
        self.version = str(meta.get("version", d.name))
        self.metadata: dict[str, object] = meta

    def p_bad(self, features: DraftFeatures) -> float:
        """The head's probability of the "bad" class for one draft."""
        return float(self.p_bad_batch(features.vector()[None, :])[0])

    def p_bad_batch(self, x: np.ndarray) -> np.ndarray:
        """Probabilities of "bad" for rows of ``x`` (float32 ``(n, len(FEATURE_NAMES))``), float64 ``(n,)``."""
        out = self._session.run(["probabilities"], {"features": x.astype(np.float32)})[0]
        return np.clip(np.asarray(out, dtype=np.float64)[:, 1], 0.0, 1.0)


def load_verifier(spec: str | Path | None = None) -> Verifier:
    """``None``/``"heuristic"``: the shipped ``HeuristicVerifier``; else a directory holding a
    trained head (``OnnxVerifier``). Raises ``ModelNotFoundError``."""
    if spec is None or str(spec) in ("", "heuristic"):
        return HeuristicVerifier()
    return OnnxVerifier(spec)


def model_verifier(model_dir: str | Path) -> OnnxVerifier | None:
    """The verifier head in the difficulty model directory ``model_dir`` (see the module), or None
    when it holds no ``verifier.json``. Raises ``ModelNotFoundError`` for a head that does not load."""
    d = Path(model_dir)
    return OnnxVerifier(d) if (d / VERIFIER_FILES[1]).is_file() else None
