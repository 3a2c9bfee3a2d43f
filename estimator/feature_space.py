"""Feature-space ids: which vector space a model's head reads (encoder file, tokenizer,
token window, head feature names, pooling), so logged head inputs are reused only by a model that
reads the same space.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.manifest import Manifest

_SPACE_CACHE: dict[tuple[str, int, int, tuple[str, ...], str], str] = {}
#: ``feature_space_of`` per loaded model: id(manifest) -> (manifest, model_dir, space id).
_LOADED: dict[int, tuple[Manifest, str | Path, str]] = {}


def feature_space_of(estimator: object) -> str | None:
    """The id of the vector space a ``DifficultyEstimator``'s head reads, or None for an estimator
    without a model directory (``FixedDifficulty``).

    ``"<encoder kind>-<12 hex>"``: sha256 over the encoder ONNX file, the tokenizer, the token
    window, the head's feature names and its pooling (a ``mean`` pooling adds nothing: ids of models
trained before pooling existed are unchanged). Two models with the same encoder and request features
    (a champion and a challenger trained with ``--encoder-from``) share it, so head inputs logged
    under one can train and score the other. Cached per file (path, size, mtime), and per loaded
    model (its ``Manifest`` object: the files it was loaded from are read once).
    """
    from pointsman.estimator.manifest import Manifest

    model_dir: object = getattr(estimator, "model_dir", None)
    manifest: object = getattr(estimator, "manifest", None)
    if not isinstance(model_dir, (str, Path)) or not isinstance(manifest, Manifest):
        return None
    known = _LOADED.get(id(manifest))  # the decision log asks once per decision: no stat each time
    if known is not None and known[0] is manifest and known[1] == model_dir:
        return known[2]
    space = feature_space_id(Path(model_dir), manifest)
    if len(_LOADED) >= 16:
        _LOADED.clear()
    _LOADED[id(manifest)] = (manifest, model_dir, space)
    return space


def feature_space_id(model_dir: Path, manifest: Manifest) -> str:
    """``feature_space_of`` for a model directory and its ``Manifest`` (see there)."""
    enc = manifest.encoder
    path = Path(model_dir) / enc.file
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, tuple(manifest.head.feature_names), manifest.head.pooling)
    cached = _SPACE_CACHE.get(key)
    if cached is None:
        h = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        h.update((Path(model_dir) / enc.tokenizer).read_bytes())
        h.update(f"|{enc.max_tokens}|{enc.add_special_tokens}|".encode())
        h.update("\n".join(manifest.head.feature_names).encode())
        if manifest.head.pooling != "mean":
            h.update(f"|pooling={manifest.head.pooling}".encode())
        cached = f"{enc.kind}-{h.hexdigest()[:12]}"
        _SPACE_CACHE[key] = cached
    return cached

