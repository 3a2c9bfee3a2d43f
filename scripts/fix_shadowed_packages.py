#!/usr/bin/env python
"""Give back the files xds-protos overwrote in other installed distributions.

xds-protos (the generated Envoy API, needed by the ext_proc endpoint picker: the ``ext-proc`` extra)
also ships its own generated copies of ``opentelemetry/proto/...`` (older than opentelemetry-proto's:
MLflow's tracing then fails to import ``TracesData``) and an empty ``cel/__init__.py`` (over
common-expression-language's, which imports the CEL extension). pip lets the last distribution
installed win each file, so the result depends on install order. This script finds every installed
distribution that lists a file xds-protos also lists, and whose file on disk is no longer its own
(the sha256 in its RECORD differs), and reinstalls it at the same version without dependencies
(``pip install --force-reinstall --no-deps NAME==VERSION``), so the real packages own their files.
xds-protos' Envoy modules keep working (they only need the message definitions, which the newer
opentelemetry-proto files still hold; the ext_proc modules import none of them).

    python scripts/fix_shadowed_packages.py            # reinstall what is shadowed
    python scripts/fix_shadowed_packages.py --check    # exit 1 and name them, change nothing

``make install-train``, the Dockerfile and ``tests/test_packaging.py`` (the check) use it.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
from importlib import metadata
from pathlib import Path

OVERWRITER = "xds-protos"


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _digest(path: Path) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()


def shadowed() -> list[tuple[str, str, list[str]]]:
    """``(name, version, files)`` of each distribution whose files shared with xds-protos are not its own on disk."""
    try:
        xds = metadata.distribution(OVERWRITER)
    except metadata.PackageNotFoundError:
        return []
    theirs = {str(f) for f in xds.files or () if "__pycache__" not in str(f) and ".dist-info" not in str(f)}
    out = []
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if _norm(name) == OVERWRITER:
            continue
        lost = []
        for f in dist.files or ():
            if str(f) in theirs and f.hash is not None:
                path = Path(str(f.locate()))
                if path.exists() and _digest(path) != f"{f.hash.mode}={f.hash.value}":
                    lost.append(str(f))
        if lost:
            out.append((name, dist.version, lost))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only report; exit 1 when something is shadowed")
    args = ap.parse_args()
    found = shadowed()
    for name, version, files in found:
        print(f"{name} {version}: {len(files)} file(s) overwritten by {OVERWRITER} (e.g. {files[0]})")
    if args.check or not found:
        return 1 if found else 0
    pins = [f"{name}=={version}" for name, version, _ in found]
    subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--force-reinstall",
                    "--no-deps", *pins], check=True)
    left = shadowed()
    for name, _, files in left:
        print(f"still shadowed: {name} ({files[0]})", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
