"""Serving-side text encoders on numpy / onnxruntime + ``tokenizers`` (no torch).

- ``StaticEncoder``: a static token-embedding table distilled from all-MiniLM-L6-v2
  with model2vec. Graph: ``input_ids`` int64 (n,) → gather rows → dequantize →
  mean → L2 normalize → ``embedding`` float32 (1, dim). The graph is a table lookup: its
  table is read from the ONNX file's initializers (``read_static_table``, with ``onnx``) and
  the graph computed in numpy, about half onnxruntime's CPU (its per-run overhead and a slower
  reduction: ~12 against ~24 us for 30 tokens, ~50 against ~118 us for 500; the same embedding up to
  float32 rounding, ~1e-6). Cost grows with the token count up to ``max_tokens`` and stops there.
- ``TransformerEncoder``: all-MiniLM-L6-v2 in ONNX. Graph: ``input_ids`` and
  ``attention_mask`` int64 (b, L) → mean pooling over the mask → L2 normalize →
  ``embedding`` float32 (b, 384). Inputs are cut to ``max_tokens`` (with [CLS]/[SEP]).

Both expose ``encode(text) -> float32 (dim,)`` and ``encode_batch(texts) -> float32 (n, dim)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from pointsman.estimator.manifest import EncoderSpec
from pointsman.estimator.wordpiece import word_piece_ids

if TYPE_CHECKING:  # pragma: no cover
    import onnx


def session_options(intra_op_threads: int = 1) -> ort.SessionOptions:
    """onnxruntime options for in-process serving: ``intra_op_threads`` threads (default 1),
    sequential execution, full graph optimization, warnings silenced."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, int(intra_op_threads))
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    return opts


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` from ``tokenizer.json`` with padding and truncation disabled
    (the packaged MiniLM tokenizer pads/truncates to 128 otherwise)."""
    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.no_truncation()
    return tok


#: The static encoder graph's floor on the mean's L2 norm (``eps``).
STATIC_EPS = 1e-12


def static_nodes(quantize: str) -> list[onnx.NodeProto]:
    """The nodes of the static encoder graph ``export.build_static_onnx`` writes for ``quantize``
    (``"int8-per-row"`` or ``"fp32"``): gather → (dequantize) → mean → L2 normalize. Serving reads the
    table of a graph made of exactly these (``read_static_table``). Raises ``ValueError``
    for another ``quantize``."""
    from onnx import TensorProto, helper

    if quantize == "int8-per-row":
        nodes = [
            helper.make_node("Gather", ["table_int8", "input_ids"], ["rows_int8"], axis=0),
            helper.make_node("Cast", ["rows_int8"], ["rows_raw"], to=TensorProto.FLOAT),
            helper.make_node("Gather", ["row_scale", "input_ids"], ["scales"], axis=0),
            helper.make_node("Unsqueeze", ["scales", "axis1"], ["scales_col"]),
            helper.make_node("Mul", ["rows_raw", "scales_col"], ["rows"]),
        ]
    elif quantize == "fp32":
        nodes = [helper.make_node("Gather", ["table", "input_ids"], ["rows"], axis=0)]
    else:
        raise ValueError(f"unknown quantization {quantize!r}")
    return nodes + [
        helper.make_node("ReduceMean", ["rows"], ["mean"], axes=[0], keepdims=1),
        helper.make_node("ReduceL2", ["mean"], ["norm"], axes=[1], keepdims=1),
        helper.make_node("Max", ["norm", "eps"], ["norm_safe"]),
        helper.make_node("Div", ["mean", "norm_safe"], ["embedding"]),
    ]


def read_static_table(model_path: str | Path) -> tuple[np.ndarray, np.ndarray | None, float]:
    """The static encoder's table from its ONNX file: ``(table, row_scale, eps)``, ``table`` int8 (V, d)
    with ``row_scale`` float32 (V,) (``int8-per-row``) or float32 (V, d) with None (``fp32``), ``eps`` the
    floor on the mean's norm. Raises ``ValueError`` when the graph is not one ``export.build_static_onnx``
    writes (its nodes compared one by one), so no other graph is computed as if it were."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(model_path)).graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    quantize = "int8-per-row" if "table_int8" in inits else "fp32"
    want = [n.SerializeToString() for n in static_nodes(quantize)]
    if [n.SerializeToString() for n in graph.node] != want or [i.name for i in graph.input] != ["input_ids"]:
        raise ValueError(f"{model_path}: not a static encoder graph of this Pointsman (export.build_static_onnx)")
    eps = float(np.asarray(inits["eps"], dtype=np.float32).reshape(-1)[0])
    if quantize == "fp32":
        return np.ascontiguousarray(inits["table"], dtype=np.float32), None, eps
    table, scale = inits["table_int8"], inits["row_scale"]
    if table.dtype != np.int8 or scale.dtype != np.float32 or scale.shape != table.shape[:1]:
        raise ValueError(f"{model_path}: static encoder table int8 (V, d) with float32 (V,) scales expected, "
                         f"got {table.dtype} {table.shape} and {scale.dtype} {scale.shape}")
    return np.ascontiguousarray(table), np.ascontiguousarray(scale), eps


class StaticEncoder:
    """Static embedding in numpy: mean of the query's token vectors, L2-normalized (the ONNX graph's
    computation on its table, ``read_static_table``).

    ``encode(text)`` returns float32 (dim,); an input with no known tokens embeds as zeros.
    Special tokens are not added and unknown tokens are dropped (as model2vec does).
    Raises ``ValueError`` when ``model_path`` is not a static encoder graph or its width is not ``spec.dim``.
    """

    def __init__(self, model_path: str | Path, tokenizer: Tokenizer, spec: EncoderSpec):
        self.spec = spec
        self.tokenizer = tokenizer
        self._table, self._row_scale, self._eps = read_static_table(model_path)
        self._eps32 = np.float32(self._eps)  # the norm's floor as the arithmetic's type, once
        if self._table.shape[1] != int(spec.dim):
            raise ValueError(f"{model_path}: table width {self._table.shape[1]}, the manifest says dim {spec.dim}")
        self.dim = int(spec.dim)
        self.max_tokens = int(spec.max_tokens)
        self._unk = tokenizer.token_to_id("[UNK]")
        self._word_pieces = word_piece_ids(tokenizer)  # the library's ids, faster (``wordpiece``)

    #: ``encode`` accepts ``text``'s token ids from an earlier pass (``features.tokenized_features``).
    takes_token_ids = True

    def token_ids(self, text: str, tokens: list[int] | None = None) -> np.ndarray:
        """Token ids the table is indexed with: int64 (k,), k <= ``max_tokens``. ``tokens``:
        ``text``'s ids without special tokens when already known (else ``text`` is tokenized)."""
        if tokens is None:
            tokens = self._word_pieces(text) if self._word_pieces is not None else \
                self.tokenizer.encode(text, add_special_tokens=False).ids
        ids = tokens
        if self._unk is not None and self._unk in ids:  # the scan in C; the filter only when needed
            ids = [i for i in ids if i != self._unk]
        return np.asarray(ids[: self.max_tokens], dtype=np.int64)

    def encode(self, text: str, tokens: list[int] | None = None) -> np.ndarray:
        """Embedding of ``text``: float32 (dim,), unit L2 norm (zeros if no tokens). ``tokens``:
        ``tokenizer.encode(text, add_special_tokens=False).ids`` when the caller has them."""
        ids = self.token_ids(text, tokens)
        if ids.size == 0:
            return np.zeros(self.dim, dtype=np.float32)
        rows = self._table.take(ids, axis=0)  # (k, dim)
        if self._row_scale is None:
            total = rows.sum(axis=0)
        else:  # the dequantized rows' sum as one product: sum_i scale_i * q_i
            total = self._row_scale.take(ids) @ rows.astype(np.float32)
        mean = total / np.float32(ids.size)
        norm = np.float32(np.sqrt(mean @ mean))
        return np.asarray(mean / max(norm, self._eps32), dtype=np.float32)

    def encode_batch(self, texts: list[str]) -> np.ndarray:
        """Embeddings of ``texts``: float32 (n, dim)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i] = self.encode(t)
        return out


class TransformerEncoder:
    """all-MiniLM-L6-v2 on onnxruntime with a bounded token window.

    ``encode(text)`` returns float32 (384,); the input is tokenized with [CLS]/[SEP] and
    cut to ``max_tokens`` (keeping the final [SEP]).
    """

    def __init__(self, model_path: str | Path, tokenizer: Tokenizer, spec: EncoderSpec, intra_op_threads: int = 1):
        self.spec = spec
        self.tokenizer = tokenizer
        self.session = ort.InferenceSession(
            str(model_path), sess_options=session_options(intra_op_threads), providers=["CPUExecutionProvider"]
        )
        self.dim = int(spec.dim)
        self.max_tokens = int(spec.max_tokens)
        self._sep = tokenizer.token_to_id("[SEP]")
        self._pad = tokenizer.token_to_id("[PAD]") or 0

    #: ``encode`` tokenizes itself (with special tokens); ids from another pass are not used.
    takes_token_ids = False

    def token_ids(self, text: str) -> list[int]:
        """Token ids with [CLS] … [SEP], at most ``max_tokens`` long."""
        ids: list[int] = list(self.tokenizer.encode(text, add_special_tokens=True).ids)
        if len(ids) > self.max_tokens:
            ids = ids[: self.max_tokens - 1] + [self._sep]
        return ids

    def encode(self, text: str, tokens: list[int] | None = None) -> np.ndarray:
        """Embedding of ``text``: float32 (dim,), unit L2 norm. ``tokens`` is ignored (this
        encoder needs its special tokens; ``takes_token_ids`` is False)."""
        ids = np.asarray([self.token_ids(text)], dtype=np.int64)
        mask = np.ones_like(ids)
        return np.asarray(self.session.run(None, {"input_ids": ids, "attention_mask": mask})[0][0], dtype=np.float32)

    def encode_batch(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        """Embeddings of ``texts``: float32 (n, dim); batches of similar length, padded."""
        seqs = [self.token_ids(t) for t in texts]
        order = np.argsort([len(s) for s in seqs], kind="stable")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            width = max(len(seqs[i]) for i in idx)
            ids = np.full((len(idx), width), self._pad, dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                ids[row, : len(seqs[i])] = seqs[i]
                mask[row, : len(seqs[i])] = 1
            out[idx] = self.session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        return out


def make_encoder(model_dir: str | Path, spec: EncoderSpec, intra_op_threads: int = 1) -> StaticEncoder | TransformerEncoder:
    """The encoder named by ``spec`` from ``model_dir`` (tokenizer loaded with padding and
    truncation disabled). Raises ``ValueError`` for an unknown kind."""
    model_dir = Path(model_dir)
    tok = load_tokenizer(model_dir / spec.tokenizer)
    if spec.kind == "static":
        return StaticEncoder(model_dir / spec.file, tok, spec)
    if spec.kind == "minilm":
        return TransformerEncoder(model_dir / spec.file, tok, spec, intra_op_threads)
    raise ValueError(f"unknown encoder kind {spec.kind!r}")
