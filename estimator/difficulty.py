"""The onnxruntime ``DifficultyEstimator``: request features → ``p_hard``.

``p_hard`` is the calibrated probability that the cheaper model's answer is worse
than the frontier model's. Pipeline per request: the query window
(``RequestFeatures.query_text``; with the conversation block, followed by earlier user
turns) is embedded by the encoder (``encoder.onnx``), concatenated with the cheap request
features of ``estimator.markers`` and the optional blocks of ``estimator.conversation``, and scored
by the head (``head.onnx``, a scikit-learn model exported with skl2onnx; the linear head, the shipped
recipe's, computed in numpy from the file's weights, ``estimator.linear_head``, any other graph on
onnxruntime).

Serving imports only onnxruntime, onnx, tokenizers, numpy and the standard library.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from pointsman.errors import ModelNotFoundError
from pointsman.estimator.conversation import BLOCKS, head_layout
from pointsman.estimator.encoders import make_encoder, session_options
from pointsman.estimator.estimate import DifficultyEstimate
from pointsman.estimator.features import RequestFeatures
from pointsman.estimator.head_inputs import HeadInputs, short_instruction
from pointsman.estimator.linear_head import read_linear_head
from pointsman.estimator.manifest import Manifest, content_version, read_manifest
from pointsman.estimator.markers import FEATURE_NAMES


def read_alone(features: RequestFeatures) -> RequestFeatures:
    """A short follow-up's turn read without its conversation: ``features.alone`` (a one-turn request
    of the system messages, tools and the turn); for features built without it (read back from the
    outcome log), the request without its earlier user turns' context."""
    if features.alone is not None:
        return features.alone
    return dataclasses.replace(features, context_text="", context_chars=0, continues=None)


class OnnxHead:
    """A head graph other than the linear one (``linear_head.read_linear_head`` returns None: an MLP
    ensemble) on onnxruntime: ``__call__(x float32 (n, d)) -> p_hard float32 (n,)``."""

    def __init__(self, path: Path, input_name: str, output_name: str, intra_op_threads: int = 1) -> None:
        self.session = ort.InferenceSession(str(path), sess_options=session_options(intra_op_threads),
                                            providers=["CPUExecutionProvider"])
        self.input_name, self.output_name = input_name, output_name

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = self.session.run([self.output_name], {self.input_name: np.ascontiguousarray(x, dtype=np.float32)})[0]
        return np.asarray(out, dtype=np.float32).reshape(-1)


class DifficultyEstimator:
    """Scores requests with the model in one model directory (see ``estimator.manifest``).

    ``version``: the manifest's content version (e.g. ``pointsman-difficulty-1a2b3c4d5e6f``).
    ``source``: where the model came from (``bundled``, a directory, ``models:/NAME@ALIAS``).
    ``tokenizer``: the encoder's ``tokenizers.Tokenizer`` with padding/truncation disabled,
    for ``extract_features(request, est.tokenizer)`` (or ``tokenized_features``, whose query
    token ids ``estimate`` takes when ``takes_query_token_ids``).
    ``timeout_ms``: time budget per ``estimate`` call; an estimate that overruns it is
    returned as unavailable (``error="timeout: ..."``). ``None`` disables the budget.
    ``intra_op_threads``: onnxruntime threads per session (1 for in-process serving).
    ``head``: ``p_hard`` of head inputs, float32 (n, d) -> (n,): a ``linear_head.LinearHead`` (numpy) for
    the graph ``export.export_head`` writes for a logistic ranker, else an ``OnnxHead``.

    Raises ``ModelNotFoundError`` when the directory is not a valid model directory, its files'
    content version (``manifest.content_version``) is not the manifest's ``version``, or the
    head's feature layout does not match this version of Pointsman.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        timeout_ms: float | None = None,
        intra_op_threads: int = 1,
        source: str | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.manifest: Manifest = read_manifest(self.model_dir)
        m = self.manifest
        files = [m.encoder.file, m.encoder.tokenizer, m.head.file]
        found = content_version(self.model_dir, files, m.head.feature_names, m.name, m.head.pooling)
        if found != m.version:  # decisions name the version: it must be the files' that score them
            raise ModelNotFoundError(f"{self.model_dir}: its files are {found}, not the manifest's version {m.version} "
                                     "(a file replaced or the manifest edited after training); refusing to serve it "
                                     "under a version it is not")
        self.version: str = m.version
        self.source: str = source or str(self.model_dir)
        self.timeout_ms = timeout_ms
        spec = self.manifest.encoder
        blocks = head_layout(self.manifest.head.feature_names, spec.dim)
        if blocks is None:
            raise ModelNotFoundError(
                f"{self.model_dir}: head expects {len(self.manifest.head.feature_names)} features that do not match "
                f"this Pointsman's encoder dim {spec.dim} + {len(FEATURE_NAMES)} request features (+ optional blocks "
                f"{', '.join(name for name, _ in BLOCKS)}); retrain the model"
            )
        #: The optional head-input blocks this model reads (``estimator.conversation``).
        self.blocks: tuple[str, ...] = blocks
        try:
            self.encoder = make_encoder(self.model_dir, spec, intra_op_threads)
            head_path = self.model_dir / self.manifest.head.file
            self.head: Callable[[np.ndarray], np.ndarray] = read_linear_head(head_path) or OnnxHead(
                head_path, self.manifest.head.input, self.manifest.head.output, intra_op_threads)
        except Exception as exc:  # onnxruntime raises its own exception types for corrupt files
            raise ModelNotFoundError(f"{self.model_dir}: cannot load ONNX model ({type(exc).__name__}: {exc})") from None
        self.tokenizer = self.encoder.tokenizer
        self._inputs = HeadInputs(self.encoder, blocks, self.manifest.head.pooling)

    def __repr__(self) -> str:
        return f"DifficultyEstimator(version={self.version!r}, encoder={self.manifest.encoder.kind!r}, source={self.source!r})"

    @property
    def takes_query_token_ids(self) -> bool:
        """True when ``estimate`` uses ``query_token_ids`` (the static encoder; the transformer
        encoder adds special tokens and tokenizes itself)."""
        return bool(getattr(self.encoder, "takes_token_ids", False))

    @property
    def bounded_cost(self) -> bool:
        """True when one ``estimate`` is plain arithmetic bounded by the query window
        (``features.QUERY_WINDOW_CHARS``): the static encoder in numpy, no I/O and no transformer, at most
        ~0.9 ms here (a follow-up's three readings of a full window). Such an estimate cannot hang, so the
        service runs it on the event loop instead of handing it to the deadline's pool
        (``service.deadline.DeadlineEstimator``)."""
        return self.manifest.encoder.kind == "static"

    def feature_vector(self, features: RequestFeatures, query_token_ids: list[int] | None = None) -> np.ndarray:
        """The head's input for one request: float32 (1, n_features) (``estimator.head_inputs``).
        ``query_token_ids``: see ``estimate``."""
        return self._inputs.vector(features, query_token_ids if self.takes_query_token_ids else None)

    def estimate(self, features: RequestFeatures, query_token_ids: list[int] | None = None) -> DifficultyEstimate:
        """``p_hard`` for one request; never raises for a valid ``RequestFeatures``.

        ``query_token_ids``: ``self.tokenizer.encode(features.query_text,
        add_special_tokens=False).ids`` when the caller has them already
        (``features.tokenized_features``), so the query window is not tokenized twice.
        A short follow-up (``features.continues``) gets the larger ``p_hard`` of the request it continues
        and of itself read alone (no context): "yes, go on" after a proof scores the proof, and a short
        hard question after "hi" keeps its own score (the safe side both ways).
        Failures and budget overruns come back as ``available=False`` with ``error`` set.
        ``latency_ms`` is the wall time of this call; ``features`` is the head input (d,).
        """
        start = time.perf_counter()
        try:
            if features.continues is None:
                x, readings = self.feature_vector(features, query_token_ids), ["request"]
            else:  # a short follow-up: the request it continues, or the turn read alone if that is harder
                x = np.vstack([self.feature_vector(features.continues),
                               self.feature_vector(read_alone(features), query_token_ids)])
                readings = ["continued", "alone"]
            whole = features if features.continues is None else features.continues
            if self._doubts_instruction(whole):  # a short instruction may be a greeting: the mean reading too
                ids = query_token_ids if features.continues is None and self.takes_query_token_ids else None
                x = np.vstack([x, self._inputs.whole(x[:1], whole, ids)])  # x[0] is ``whole``'s pooled reading
                readings.append("whole")
            ps = self.head(x)
            best = int(ps.argmax())  # the method: np.argmax's dispatch costs ~1 us more
            p, x = float(ps[best]), x[best:best + 1]
            reading = readings[best]
        except Exception as exc:  # noqa: BLE001 - the contract is "never raises"
            elapsed = (time.perf_counter() - start) * 1000.0
            return DifficultyEstimate(None, False, elapsed, f"{type(exc).__name__}: {exc}")
        elapsed = (time.perf_counter() - start) * 1000.0
        if not math.isfinite(p):  # a Python float: math's test, not a numpy call
            return DifficultyEstimate(None, False, elapsed, f"head returned a non-finite p_hard ({p})")
        if self.timeout_ms is not None and elapsed > self.timeout_ms:
            return DifficultyEstimate(None, False, elapsed, f"timeout: {elapsed:.2f} ms > budget {self.timeout_ms:g} ms",
                                      features=x[0])
        return DifficultyEstimate(min(max(p, 0.0), 1.0), True, elapsed, features=x[0], reading=reading)

    def _doubts_instruction(self, features: RequestFeatures) -> bool:
        """Whether ``features`` is pooled with an instruction short enough to be a preamble
        (``head_inputs.short_instruction``): then the query read as one mean is scored too, and the larger
        ``p_hard`` counts ("Hello there. <a derivation>" must not read as "Hello there.")."""
        cut = self._inputs.instruction_cut(features)
        return cut > 0 and short_instruction(features.query_text[:cut])

    def feature_matrix(self, features: list[RequestFeatures]) -> np.ndarray:
        """Head inputs for many requests: float32 (n, n_features)."""
        return self._inputs.matrix(features)

    def predict_matrix(self, x: np.ndarray) -> np.ndarray:
        """``p_hard`` for precomputed head inputs ``x`` float32 (n, n_features): float32 (n,)."""
        if len(x) == 0:
            return np.zeros(0, dtype=np.float32)
        return self.head(np.asarray(x, dtype=np.float32))

    def estimate_batch(self, features: list[RequestFeatures]) -> np.ndarray:
        """``p_hard`` for many requests (evaluation): float32 (n,), each as ``estimate`` scores it (a
        short follow-up the larger of its two readings). Raises on failure."""
        if not features:
            return np.zeros(0, dtype=np.float32)
        p = self._with_whole(features, self.predict_matrix(self.feature_matrix(features)))
        follow = [i for i, f in enumerate(features) if f.continues is not None]
        if follow:
            continues = [c for f in features if (c := f.continues) is not None]
            continued = self._with_whole(continues, self.predict_matrix(self.feature_matrix(continues)))
            alone = self.predict_matrix(self.feature_matrix([read_alone(features[i]) for i in follow]))
            p[follow] = np.maximum(continued, alone)
        return p

    def _with_whole(self, features: list[RequestFeatures], p: np.ndarray) -> np.ndarray:
        """``p`` (n,) raised to the whole reading's ``p_hard`` where ``_doubts_instruction``, as ``estimate``."""
        doubt = [i for i, f in enumerate(features) if self._doubts_instruction(f)]
        if doubt:
            whole = self.predict_matrix(self._inputs.matrix([features[i] for i in doubt], pooled=False))
            p[doubt] = np.maximum(p[doubt], whole)
        return p
