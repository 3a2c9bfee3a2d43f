"""The difficulty head in numpy, when its graph is the linear one training writes.

``export.export_head`` writes ``head.onnx``: skl2onnx's conversion of the ranker (a logistic regression
after its scaling: one ``Scaler`` for ``scale="standard"``, two column blocks, z-scores and min-max,
for ``"blocks"``), then our nodes (``head_tail_nodes``): the gate's penalty
``gate_weight * softplus(-(features @ gate_coef + gate_bias))`` subtracted from the ranker's clipped
log-odds (with a gate) and the Platt map ``sigmoid(slope * logit + intercept)``. Every step before the
clipped log-odds is affine, so the whole head is one (d, 2) product and a few scalar maps on its two
columns: ``read_linear_head`` reads the weights from the file's initializers and node attributes (the
model format and its content version unchanged) when the nodes ``p_hard`` depends on are exactly these,
node for node, and returns None for any other graph (an MLP ensemble, ``DifficultyHead(kind="mlp")``),
which ``DifficultyEstimator`` runs on onnxruntime as before.

Computed in float64, ``p_hard`` is onnxruntime's up to its float32 rounding (~1e-7; near the ranker's
upper clip, where a float32 ulp of ``q`` is a few percent of ``1 - q``, onnxruntime's is the less
exact one): ``tests/estimator/test_linear_head.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import onnx

_ML = "ai.onnx.ml"
#: A node as the templates below give it: op type, domain, inputs, outputs, attributes that must hold these values.
_Node = tuple[str, str, list[str], list[str], dict[str, object]]
#: skl2onnx's nodes of the ranker that ``p_hard`` depends on, per ``DifficultyHead.scale``. ``Scaler``'s
#: ``offset``/``scale`` and ``LinearClassifier``'s ``coefficients``/``intercepts`` are read; no other
#: attribute may be set. ``{x}``: the classifier's input.
_CLASSIFIER: list[_Node] = [
    ("LinearClassifier", _ML, ["{x}"], ["label_0", "voting_proba_0"],
     {"classlabels_ints": [0, 1], "multi_class": 0, "post_transform": b"LOGISTIC"}),
    ("Mul", "", ["voting_proba_0", "w0"], ["wprob_name"], {}),  # soft voting over one member, weight 1
    ("Sum", "", ["wprob_name"], ["probabilities"], {}),
]
_RANKERS: dict[str, list[_Node]] = {
    "standard": [("Scaler", _ML, ["features"], ["variable"], {})],
    "blocks": [
        ("ArrayFeatureExtractor", _ML, ["features", "column_indices"], ["extracted_feature_columns"], {}),
        ("ArrayFeatureExtractor", _ML, ["features", "column_indices1"], ["extracted_feature_columns1"], {}),
        ("Cast", "", ["extracted_feature_columns1"], ["Ca_output0"], {"to": 1}),
        ("Scaler", _ML, ["extracted_feature_columns"], ["variable"], {}),
        ("Mul", "", ["Ca_output0", "Mu_Mulcst"], ["Mu_C0"], {}),  # min-max: x * scale + min
        ("Add", "", ["Mu_C0", "Ad_Addcst"], ["variable1"], {}),
        ("Concat", "", ["variable", "variable1"], ["transformed_column"], {"axis": 1}),
    ],
}
_READ = {"Scaler": {"offset", "scale"}, "LinearClassifier": {"coefficients", "intercepts"}}


def head_tail_nodes(probabilities: str, gated: bool) -> list[onnx.NodeProto]:
    """The nodes ``export.export_head`` appends to skl2onnx's ranker (whose class probabilities
    float32 (n, 2) are ``probabilities``): ``q`` = column 1, lowered by the gate when ``gated``
    (``DifficultyHead._gated``), then ``p_hard = sigmoid(slope * logit(clip(q)) + intercept)`` (n,)."""
    from onnx import helper

    nodes = [helper.make_node("Gather", [probabilities, "ph_index1"], ["ph_q"], axis=1)]
    if gated:
        nodes += [
            helper.make_node("Clip", ["ph_q", "ph_lo", "ph_hi"], ["gate_qc"]),
            helper.make_node("Sub", ["ph_one", "gate_qc"], ["gate_q0"]),
            helper.make_node("Div", ["gate_qc", "gate_q0"], ["gate_odds"]),
            helper.make_node("Log", ["gate_odds"], ["gate_logit"]),
            helper.make_node("MatMul", ["features", "gate_coef"], ["gate_g2"]),
            helper.make_node("Squeeze", ["gate_g2", "gate_axes"], ["gate_g"]),
            helper.make_node("Add", ["gate_g", "gate_bias"], ["gate_gs"]),
            helper.make_node("Neg", ["gate_gs"], ["gate_neg"]),
            helper.make_node("Softplus", ["gate_neg"], ["gate_sp"]),
            helper.make_node("Mul", ["gate_sp", "gate_weight"], ["gate_pen"]),
            helper.make_node("Sub", ["gate_logit", "gate_pen"], ["gate_z"]),
            helper.make_node("Sigmoid", ["gate_z"], ["ph_qg"]),
        ]
    return nodes + [
        helper.make_node("Clip", ["ph_qg" if gated else "ph_q", "ph_lo", "ph_hi"], ["ph_qc"]),
        helper.make_node("Sub", ["ph_one", "ph_qc"], ["ph_q0"]),
        helper.make_node("Div", ["ph_qc", "ph_q0"], ["ph_odds"]),
        helper.make_node("Log", ["ph_odds"], ["ph_logit"]),
        helper.make_node("Mul", ["ph_logit", "ph_slope"], ["ph_scaled"]),
        helper.make_node("Add", ["ph_scaled", "ph_intercept"], ["ph_z"]),
        helper.make_node("Sigmoid", ["ph_z"], ["p_hard"]),
    ]


@dataclass(frozen=True)
class LinearHead:
    """The linear head's arithmetic. ``weights`` float64 (d, 2) and ``bias`` (2 floats): column 0 the ranker's
    log-odds (its scaling folded in), column 1 the gate's score (zeros without a gate, whose
    ``gate_weight`` is 0); ``logit_lo``/``logit_hi``: the log-odds of the graph's float32 clip bounds;
    ``slope``/``intercept``: the Platt map."""

    weights: np.ndarray
    bias: tuple[float, float]
    gate_weight: float
    logit_lo: float
    logit_hi: float
    slope: float
    intercept: float

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``p_hard`` float32 (n,) of head inputs ``x`` float32 (n, d), as the graph computes it
        (``logit(clip(sigmoid(s)))`` is ``s`` clipped on the log-odds). Raises ``ValueError`` for another d.
        Row by row in Python floats after the product: for the 1-3 rows of a request a numpy call per
        step would cost more than the arithmetic."""
        return np.array([self._p_hard(r, g) for r, g in (x @ self.weights).tolist()], dtype=np.float32)

    def _p_hard(self, ranker: float, gate: float) -> float:
        lo, hi = self.logit_lo, self.logit_hi
        logit = min(max(ranker + self.bias[0], lo), hi)
        t = -(gate + self.bias[1])  # the penalty's softplus(t), without overflow
        penalty = self.gate_weight * (t + math.log1p(math.exp(-t)) if t > 0 else math.log1p(math.exp(t)))
        z = self.slope * min(max(logit - penalty, lo), hi) + self.intercept
        return 1.0 / (1.0 + math.exp(-z)) if z > -700.0 else 0.0  # exp(700) is near float64's top; float32(1e-304) 0


def _logit(p: np.ndarray) -> float:
    q = float(p)
    return float(np.log(q / (1.0 - q)))


def _matches(node: onnx.NodeProto, want: _Node, x: str) -> bool:
    from onnx import helper

    op, domain, inputs, outputs, fixed = want
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return (node.op_type == op and node.domain == domain and list(node.input) == [i.format(x=x) for i in inputs]
            and list(node.output) == outputs and set(attrs) == set(fixed) | _READ.get(op, set())
            and all(attrs[k] == v for k, v in fixed.items()))


def read_linear_head(model_path: str | Path) -> LinearHead | None:
    """The head at ``model_path`` as a ``LinearHead`` when ``p_hard``'s nodes are exactly the linear head's
    that ``export.export_head`` writes (either scaling, with or without a gate; nodes ``p_hard`` does not
    depend on, skl2onnx's label, are ignored), else None. Raises what ``onnx.load`` raises for a file
    that is not ONNX."""
    import onnx
    from onnx import helper, numpy_helper

    graph = onnx.load(str(model_path)).graph
    if [i.name for i in graph.input] != ["features"] or [o.name for o in graph.output] != ["p_hard"]:
        return None
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    needed = {"p_hard"}
    live: list[onnx.NodeProto] = []
    for node in reversed(graph.node):  # the nodes p_hard depends on, in graph order
        if needed & set(node.output):
            live.insert(0, node)
            needed |= set(node.input)
    tail = head_tail_nodes("probabilities", "gate_coef" in inits)
    if [n.SerializeToString() for n in live[-len(tail):]] != [n.SerializeToString() for n in tail]:
        return None
    scale = next((k for k, nodes in _RANKERS.items() if len(live) == len(nodes) + len(_CLASSIFIER) + len(tail)), None)
    if scale is None:
        return None
    clf_input = "variable" if scale == "standard" else "transformed_column"
    if not all(_matches(n, w, clf_input) for n, w in zip(live, _RANKERS[scale] + _CLASSIFIER)):
        return None
    attrs = {(n.op_type, n.output[0]): {a.name: helper.get_attribute_value(a) for a in n.attribute} for n in live}
    scaler = attrs[("Scaler", "variable")]
    # every column of the classifier's input as x[:, column] * mul + add
    column = np.asarray(inits.get("column_indices", np.arange(len(scaler["scale"]))), dtype=np.int64)
    mul = np.asarray(scaler["scale"], dtype=np.float64)
    add = -np.asarray(scaler["offset"], dtype=np.float64) * mul
    if scale == "blocks":
        column = np.concatenate([column, inits["column_indices1"]])
        mul = np.concatenate([mul, inits["Mu_Mulcst"].astype(np.float64)])
        add = np.concatenate([add, inits["Ad_Addcst"].astype(np.float64)])
    clf = attrs[("LinearClassifier", "label_0")]
    n_in = len(column)
    coef = np.asarray(clf["coefficients"], dtype=np.float64)
    if (coef.shape != (2 * n_in,) or len(mul) != n_in or len(add) != n_in or len(clf["intercepts"]) != 2
            or not np.array_equal(inits["w0"], [1.0]) or int(inits["ph_index1"]) != 1 or float(inits["ph_one"]) != 1.0):
        return None
    d = graph.input[0].type.tensor_type.shape.dim[1].dim_value
    if (scale == "standard" and n_in != d) or column.min(initial=0) < 0 or column.max(initial=0) >= d:
        return None
    w1 = coef[n_in:]  # class 1's row: q = sigmoid(w1 . input + b1)
    weights = np.zeros((d, 2))
    np.add.at(weights[:, 0], column, w1 * mul)
    bias = (float(clf["intercepts"][1]) + float(w1 @ add), 0.0)
    gate_weight = 0.0
    if "gate_coef" in inits:
        if inits["gate_coef"].shape != (d, 1) or not np.array_equal(inits["gate_axes"], [1]):
            return None
        weights[:, 1] = inits["gate_coef"][:, 0]
        bias = (bias[0], float(inits["gate_bias"]))
        gate_weight = float(inits["gate_weight"])
    return LinearHead(weights=weights, bias=bias, gate_weight=gate_weight, logit_lo=_logit(inits["ph_lo"]),
                      logit_hi=_logit(inits["ph_hi"]), slope=float(inits["ph_slope"]),
                      intercept=float(inits["ph_intercept"]))
