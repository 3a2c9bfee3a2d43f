"""The model directory format: ``manifest.json`` beside the ONNX files and the tokenizer.

A model directory holds::

    manifest.json     this manifest (format, version, encoder, head, training, metrics,
                      reference p_hard quantiles for deriving policy thresholds)
    encoder.onnx      text → embedding: token ids → float32 (1, dim), L2-normalized
    tokenizer.json    the encoder's tokenizer (Hugging Face ``tokenizers`` format)
    head.onnx         float32 features (n, n_features) → ``p_hard`` float32 (n,)
    PROVENANCE.md     optional: sources, licenses, the command that rebuilds it

``version`` is ``"<name>-<sha256 prefix>"`` of the ONNX files, the tokenizer and the
feature names, so two directories with the same artifacts report the same version
and a decision can name the exact model that scored it; a directory whose files are not
its manifest's version is refused at load (``DifficultyEstimator``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pointsman.errors import ModelNotFoundError
from pointsman.json_types import JSONObject

MANIFEST_FILE = "manifest.json"
FORMAT = "pointsman-difficulty/1"
ENCODER_KINDS = ("static", "minilm")
#: How a head's embedding columns pool the query (``estimator.head_inputs``).
POOLINGS = ("mean", "instruction")


@dataclass
class EncoderSpec:
    """How text becomes an embedding.

    ``kind``: ``"static"`` (token-embedding table: gather → mean → L2 normalize) or
    ``"minilm"`` (all-MiniLM-L6-v2 transformer, mean pooling, L2 normalize).
    ``file``/``tokenizer``: file names in the model directory. ``max_tokens``: the
    token window the encoder sees (bounded cost). ``dim``: embedding size.
    ``quantization``: how the weights are stored (``"int8-per-row"``, ``"fp32"``,
    ``"int8-dynamic-per-channel"``). ``add_special_tokens``: whether [CLS]/[SEP] are added.
    """

    kind: str
    file: str
    tokenizer: str
    max_tokens: int
    dim: int
    quantization: str
    add_special_tokens: bool
    base_model: str = "sentence-transformers/all-MiniLM-L6-v2"
    details: JSONObject = field(default_factory=dict)


@dataclass
class HeadSpec:
    """The scikit-learn head exported to ONNX.

    ``input``/``output``: tensor names (float32 (n, n_features) in, ``p_hard`` (n,) out).
    ``feature_names``: the head's input columns in order (``emb_0..emb_{dim-1}`` then
    ``estimator.markers.FEATURE_NAMES``). ``opset``: ONNX default-domain opset.
    ``pooling``: how the ``emb_*`` columns pool the query (``POOLINGS``, ``estimator.head_inputs``;
    ``mean`` for models trained before ``instruction`` existed).
    """

    file: str
    input: str
    output: str
    feature_names: list[str]
    opset: int
    estimator: str
    params: JSONObject = field(default_factory=dict)
    pooling: str = "mean"


@dataclass
class Manifest:
    """Everything a loader and an auditor need to know about one model directory."""

    name: str
    version: str
    encoder: EncoderSpec
    head: HeadSpec
    training: JSONObject
    metrics: JSONObject
    created_at: str
    pointsman_version: str
    format: str = FORMAT
    #: p_hard quantiles on the fixed Apache/MIT reference prompt mix
    #: (``training.reference_set.reference_quantiles``): ``{"sets", "per_set", "n",
    #: "quantiles": {"0.05": p, ..., "0.95": p}}``; empty for models trained before it existed.
    reference_p_hard: JSONObject = field(default_factory=dict)

    def to_json(self) -> str:
        """The manifest as pretty-printed JSON text."""
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"

    def write(self, model_dir: str | Path) -> Path:
        """Write ``manifest.json`` into ``model_dir``; returns its path."""
        path = Path(model_dir) / MANIFEST_FILE
        path.write_text(self.to_json(), encoding="utf-8")
        return path


def read_manifest(model_dir: str | Path) -> Manifest:
    """Read and check ``model_dir/manifest.json``.

    Raises ``ModelNotFoundError`` when the directory or manifest is missing, the JSON
    is invalid, the format is unknown, fields are missing, or a referenced file is absent.
    """
    model_dir = Path(model_dir)
    path = model_dir / MANIFEST_FILE
    if not model_dir.is_dir():
        raise ModelNotFoundError(f"model directory {model_dir} does not exist")
    if not path.is_file():
        raise ModelNotFoundError(f"{model_dir} is not a Pointsman model directory: no {MANIFEST_FILE}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("format") != FORMAT:
            raise ModelNotFoundError(f"{path}: unsupported format {raw.get('format')!r} (expected {FORMAT!r})")
        manifest = Manifest(
            name=raw["name"],
            version=raw["version"],
            encoder=EncoderSpec(**raw["encoder"]),
            head=HeadSpec(**raw["head"]),
            training=raw.get("training", {}),
            metrics=raw.get("metrics", {}),
            created_at=raw.get("created_at", ""),
            pointsman_version=raw.get("pointsman_version", ""),
            format=raw["format"],
            reference_p_hard=raw.get("reference_p_hard") or {},
        )
    except ModelNotFoundError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelNotFoundError(f"{path}: invalid manifest ({type(exc).__name__}: {exc})") from None
    if manifest.encoder.kind not in ENCODER_KINDS:
        raise ModelNotFoundError(f"{path}: unknown encoder kind {manifest.encoder.kind!r}; known: {ENCODER_KINDS}")
    if manifest.head.pooling not in POOLINGS:
        raise ModelNotFoundError(f"{path}: unknown head pooling {manifest.head.pooling!r}; known: {POOLINGS}")
    for name in (manifest.encoder.file, manifest.encoder.tokenizer, manifest.head.file):
        if not (model_dir / name).is_file():
            raise ModelNotFoundError(f"{model_dir}: manifest names {name!r} but the file is missing")
    return manifest


def content_version(model_dir: str | Path, files: list[str], feature_names: list[str], name: str,
                    pooling: str = "mean") -> str:
    """``"<name>-<first 12 hex of sha256>"`` over ``files`` (in order), the feature names and the head's
    pooling (a ``mean`` pooling adds nothing: versions of models trained before pooling existed hold).

    Stable per artifact: the same ONNX files, tokenizer and features give the same version.
    """
    h = hashlib.sha256()
    for f in files:
        h.update(f.encode())
        h.update(hashlib.sha256((Path(model_dir) / f).read_bytes()).digest())
    h.update("\n".join(feature_names).encode())
    if pooling != "mean":
        h.update(f"\npooling={pooling}".encode())
    return f"{name}-{h.hexdigest()[:12]}"
