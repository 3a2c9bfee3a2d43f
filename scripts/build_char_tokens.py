#!/usr/bin/env python
"""Build ``estimator/char_tokens.bin``: per code point, the most tokens any real tokenizer available offline
(``scripts/token_texts.py`` ``reference_tokenizers``: o200k, cl100k, Claude's, DeepSeek-V3's) gives that
character alone, in quarter tokens (one byte each, U+0000..U+10FFFF, surrogates 0), zlib-compressed (~7 KB).
Two-byte characters (U+0080..U+07FF: Latin, Greek, Hebrew, Arabic letters) count at least 1.25: in words
Claude's tokenizer gives Arabic ~1.1 tokens per letter, though most letters alone are one token. Cyrillic
letters (U+0400..U+052F) are capped at 0.75 instead: in words they merge (Russian prose: ~0.6 tokens per
letter in the largest count), where alone each is 1-2. ASCII is 0 (``billed_tokens`` counts it by classes).

    python scripts/build_char_tokens.py [--out estimator/char_tokens.bin]    # ~3 min on one core
"""

from __future__ import annotations

import argparse
import os
import sys
import zlib
from pathlib import Path

import numpy as np

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).parent))
from token_texts import reference_tokenizers  # noqa: E402

TWO_BYTE = (0x80, 0x800)
TWO_BYTE_FLOOR_QUARTERS = 5
CYRILLIC = (0x400, 0x530)
CYRILLIC_CAP_QUARTERS = 3


def build() -> np.ndarray:
    refs = reference_tokenizers()
    if len(refs) < 4:
        raise SystemExit(f"need o200k, cl100k, Claude's and DeepSeek-V3's tokenizers offline (litellm); found {sorted(refs)}")
    n = 0x110000
    out = np.zeros(n, dtype=np.uint8)
    for c in range(0x80, n):
        if 0xD800 <= c <= 0xDFFF:
            continue
        ch = chr(c)
        out[c] = min(255, 4 * max(count(ch) for count in refs.values()))
    lo, hi = TWO_BYTE
    out[lo:hi] = np.maximum(out[lo:hi], TWO_BYTE_FLOOR_QUARTERS)
    lo, hi = CYRILLIC
    out[lo:hi] = np.minimum(out[lo:hi], CYRILLIC_CAP_QUARTERS)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent.parent / "estimator" / "char_tokens.bin")
    args = parser.parse_args()
    table = build()
    args.out.write_bytes(zlib.compress(table.tobytes(), 9))
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
