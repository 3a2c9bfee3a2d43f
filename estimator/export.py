"""Building the estimator's ONNX artifacts (training side; imports torch, model2vec,
scikit-learn, skl2onnx and onnx lazily, only inside the functions that need them).

- ``distill_static(base_model_dir)``: model2vec distillation of all-MiniLM-L6-v2 into
  a static token table (offline, from the local model folder).
- ``build_static_onnx(table, path, quantize)``: the static encoder graph
  (``input_ids`` int64 (n,) → gather → dequantize → mean → L2 normalize →
  ``embedding`` float32 (1, dim)).
- ``export_minilm_onnx(base_model_dir, path)``: MiniLM with mean pooling and L2
  normalization inside the graph (``torch.onnx.export(..., dynamo=False)``, eager
  attention); ``quantize_minilm`` for int8 dynamic per-channel quantization.
- ``export_head(head, n_features, path)``: the scikit-learn head via skl2onnx
  (pinned opset, float32 input) with the Platt calibration appended, output ``p_hard`` (n,).
- ``head_parity(head, path, X)``: max |scikit-learn − onnxruntime| on ``X``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from pointsman.json_types import JSONObject

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.head import DifficultyHead

#: ONNX default-domain opset of every graph we write; ai.onnx.ml opset for skl2onnx.
OPSET = 17
ML_OPSET = 3


def distill_static(base_model_dir: str | Path) -> tuple[np.ndarray, str]:
    """Distill a static embedding table from the sentence-transformer in ``base_model_dir``.

    Uses ``model2vec.distill.distill`` offline (no PCA, SIF weighting 1e-4, mean
    pooling). Returns ``(table float32 (vocab, 384), tokenizer_json str)``; row i is
    the vector of token id i of the returned tokenizer.
    """
    from model2vec.distill import distill

    model = distill(model_name=str(base_model_dir), pca_dims=None, quantize_to="float32")
    table = np.asarray(model.embedding, dtype=np.float32)
    return table, model.tokenizer.to_str()


def quantize_rows_int8(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8 quantization: ``table ≈ q * scale[:, None]``.

    Returns ``(q int8 (V, d), scale float32 (V,))``; rows of zeros get scale 1.
    """
    table = np.asarray(table, dtype=np.float32)
    amax = np.abs(table).max(axis=1)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(table / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


def build_static_onnx(table: np.ndarray, path: str | Path, quantize: str = "int8-per-row") -> JSONObject:
    """Write the static encoder graph for ``table`` float32 (V, d) to ``path``.

    ``quantize``: ``"int8-per-row"`` (table stored as int8 with one float scale per row)
    or ``"fp32"``. Returns details for the manifest: vocab size, dim, bytes, and the
    min/mean cosine between quantized and fp32 token rows.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from pointsman.estimator.encoders import STATIC_EPS, static_nodes

    table = np.asarray(table, dtype=np.float32)
    vocab, dim = table.shape
    inits = []
    details: JSONObject = {"vocab_size": int(vocab), "dim": int(dim), "quantization": quantize}
    if quantize == "int8-per-row":
        q, scale = quantize_rows_int8(table)
        deq = q.astype(np.float32) * scale[:, None]
        norms = np.linalg.norm(table, axis=1) * np.linalg.norm(deq, axis=1)
        cos = np.where(norms > 0, (table * deq).sum(axis=1) / np.maximum(norms, 1e-12), 1.0)
        details.update(row_cosine_min=float(cos.min()), row_cosine_mean=float(cos.mean()))
        inits += [numpy_helper.from_array(q, "table_int8"), numpy_helper.from_array(scale, "row_scale"),
                  numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1")]
    elif quantize == "fp32":
        inits.append(numpy_helper.from_array(table, "table"))
    else:
        raise ValueError(f"unknown quantization {quantize!r}")
    inits.append(numpy_helper.from_array(np.array([STATIC_EPS], dtype=np.float32), "eps"))
    nodes = static_nodes(quantize)
    graph = helper.make_graph(
        nodes,
        "pointsman_static_encoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["n_tokens"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, dim])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="pointsman")
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    details["bytes"] = Path(path).stat().st_size
    return details


def export_minilm_onnx(base_model_dir: str | Path, path: str | Path) -> None:
    """Export all-MiniLM-L6-v2 from ``base_model_dir`` with mean pooling and L2 norm in-graph.

    Inputs ``input_ids``, ``attention_mask`` int64 (batch, seq); output ``embedding``
    float32 (batch, 384). TorchScript-based exporter (``dynamo=False``), eager attention.
    """
    import torch
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(str(base_model_dir), attn_implementation="eager")
    bert.eval()

    class MeanPooled(torch.nn.Module):
        def __init__(self, encoder: torch.nn.Module) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids)
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    wrapper = MeanPooled(bert).eval()
    ids = torch.tensor([[101, 7592, 2088, 102]], dtype=torch.long)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        torch.onnx.export(
            wrapper,
            (ids, mask),
            str(path),
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                          "embedding": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )


def quantize_minilm(fp32_path: str | Path, int8_path: str | Path) -> None:
    """onnxruntime dynamic int8 quantization, per-channel weights (``QInt8``)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(fp32_path), str(int8_path), per_channel=True, weight_type=QuantType.QInt8)


class HeadExport(TypedDict):
    """The head's manifest fields ``export_head`` returns."""

    input: str
    output: str
    opset: int


def export_head(head: DifficultyHead, n_features: int, path: str | Path) -> HeadExport:
    """Export a fitted ``DifficultyHead`` to ONNX at ``path``.

    The ranker pipeline is converted by skl2onnx (input ``features`` float32
    (n, n_features), opset ``OPSET``, ai.onnx.ml ``ML_OPSET``, no ZipMap); nodes for
    ``p_hard = sigmoid(a * logit(clip(q)) + b)`` are appended so the single output is
    ``p_hard`` float32 (n,); with a gate (``head.gate_coef_``), ``q`` is first lowered by it
    (``DifficultyHead._gated``: a MatMul on the features, a Softplus). Returns the head's manifest fields (input, output, opset).
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    from pointsman.estimator.linear_head import head_tail_nodes

    ranker = head.ranker_
    onx = convert_sklearn(
        ranker,
        initial_types=[("features", FloatTensorType([None, n_features]))],
        target_opset={"": OPSET, "ai.onnx.ml": ML_OPSET},
        options={id(ranker): {"zipmap": False}},
    )
    graph = onx.graph
    graph.name = "pointsman_difficulty_head"  # skl2onnx names graphs with a random uuid; keep the bytes reproducible
    prob_name = next(o.name for o in graph.output if o.name == "probabilities")
    consts: dict[str, np.ndarray] = {
        "ph_index1": np.array(1, dtype=np.int64),
        "ph_lo": np.array(1e-6, dtype=np.float32),
        "ph_hi": np.array(1.0 - 1e-6, dtype=np.float32),
        "ph_one": np.array(1.0, dtype=np.float32),
        "ph_slope": np.array(head.calibration_slope_, dtype=np.float32),
        "ph_intercept": np.array(head.calibration_intercept_, dtype=np.float32),
    }
    if head.gate_coef_ is not None:  # q lowered by the gate, exactly as DifficultyHead._gated
        consts.update({
            "gate_coef": np.asarray(head.gate_coef_, dtype=np.float32).reshape(-1, 1),
            "gate_bias": np.array(head.gate_intercept_ + head.gate_shift, dtype=np.float32),
            "gate_weight": np.array(head.gate_weight, dtype=np.float32),
            "gate_axes": np.array([1], dtype=np.int64),
        })
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    graph.node.extend(head_tail_nodes(prob_name, head.gate_coef_ is not None))
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("p_hard", TensorProto.FLOAT, [None]))
    onnx.checker.check_model(onx)
    onnx.save(onx, str(path))
    return {"input": "features", "output": "p_hard", "opset": OPSET}


def head_parity(head: DifficultyHead, path: str | Path, X: np.ndarray) -> float:
    """Max absolute difference between ``head.predict_proba(X)[:, 1]`` (scikit-learn) and
    the ONNX head at ``path`` on onnxruntime, for float32 ``X`` (n, n_features)."""
    import onnxruntime as ort

    from pointsman.estimator.encoders import session_options

    sess = ort.InferenceSession(str(path), sess_options=session_options(1), providers=["CPUExecutionProvider"])
    X = np.asarray(X, dtype=np.float32)
    got = sess.run(["p_hard"], {"features": X})[0].reshape(-1)
    want = head.predict_proba(X)[:, 1]
    return float(np.max(np.abs(got.astype(np.float64) - want))) if len(X) else 0.0
