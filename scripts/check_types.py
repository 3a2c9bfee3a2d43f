"""Static checks that need the installed package layout: import order (import-linter) and types (mypy).

The repository keeps the design card's folders at its root and maps them into one import package,
``pointsman`` (``pyproject.toml``'s ``package-dir``). import-linter (grimp) and mypy find modules by
walking folders, so this script stages the layout the package installs as — a temporary
``pointsman/`` whose entries are symlinks to ``pointsman/*.py`` and to each mapped folder — and runs
both tools there with the repository's own configuration (``[tool.importlinter]``, ``[tool.mypy]``).

    python scripts/check_types.py            # both
    python scripts/check_types.py imports    # lint-imports: the contracts of docs/architecture.md
    python scripts/check_types.py mypy       # mypy over the whole package (strict where configured)

Exit status: 0 when every check passes, else the failing tool's status.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
BIN = Path(sys.executable).parent


def package_dirs() -> dict[str, Path]:
    """``{subpackage: folder}`` from ``[tool.setuptools.package-dir]`` (``pointsman.policy`` ->
    ``<repo>/policy``), the root package ``pointsman`` included."""
    mapping = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / folder for name, folder in mapping.items()}


def stage(into: Path, extra: dict[str, str] | None = None) -> Path:
    """Build the installed layout under ``into`` (``into/pointsman/...``) from symlinks and return
    ``into``. ``extra``: ``{relative path under pointsman/: source text}`` written as real files
    (tests use it to plant a probe module); every folder on a probe's path is staged as a real
    folder of links, so the probe never lands in the repository."""
    dirs = package_dirs()
    top = into / "pointsman"
    top.mkdir(parents=True)
    planted = {Path(p).parent for p in (extra or {})}
    real = {parent for p in planted for parent in (p, *p.parents) if str(parent) != "."}

    def link(source: Path, dest: Path, rel: Path) -> None:
        if rel in real:  # a real folder whose entries are links (recursively, along the probe's path)
            dest.mkdir()
            for entry in source.iterdir():
                link(entry, dest / entry.name, rel / entry.name)
        else:
            dest.symlink_to(source)

    for f in dirs["pointsman"].glob("*.py"):
        (top / f.name).symlink_to(f)
    for name, folder in dirs.items():
        if name != "pointsman":
            sub = name.split(".", 1)[1]
            link(folder, top / sub, Path(sub))
    for rel, text in (extra or {}).items():
        target = top / rel
        assert not target.resolve().is_relative_to(ROOT), f"probe {rel} would land in the repository"
        target.write_text(text)
    return into


def _run(args: list[str], staged: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(staged), "MYPYPATH": str(staged)}
    return subprocess.run(args, cwd=staged, env=env, capture_output=True, text=True)


def lint_imports(staged: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the repository's contracts on a staged tree."""
    return _run([str(BIN / "lint-imports"), str(PYPROJECT), "--no-cache"], staged)


def mypy(staged: Path) -> subprocess.CompletedProcess[str]:
    """mypy over the staged ``pointsman`` package with the repository's configuration; its cache
    lives in ``$MYPY_CACHE_DIR`` or ``<repo>/.mypy_cache``, so a second run is incremental."""
    cache = os.environ.get("MYPY_CACHE_DIR") or str(ROOT / ".mypy_cache")
    return _run([str(BIN / "mypy"), "--config-file", str(PYPROJECT), "--cache-dir", cache, "-p", "pointsman"], staged)


def main(argv: list[str]) -> int:
    """Run the checks named in ``argv`` (``imports``, ``mypy``; default both); print their output."""
    wanted = argv or ["imports", "mypy"]
    status = 0
    with tempfile.TemporaryDirectory(prefix="pointsman-stage-") as tmp:
        staged = stage(Path(tmp))
        for check in wanted:
            if check not in ("imports", "mypy"):
                print(f"Error: unknown check {check!r} (imports, mypy)", file=sys.stderr)
                return 2
            done = lint_imports(staged) if check == "imports" else mypy(staged)
            out = (done.stdout + done.stderr).strip()
            if check == "imports":  # the contract summary, not the banner
                out = "\n".join(line for line in out.splitlines() if not line.startswith(("║", "╔", "╚", " ║", "  └", "      ╚")))
            print(out.strip())
            status = status or done.returncode
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
