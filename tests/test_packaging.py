"""The distribution installs every design-card folder under ``pointsman.*`` and nothing at top level."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ["estimator", "policy", "training", "service", "datasets", "replay", "plan"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Build from a copy of the tracked files so setuptools' build/ never lands in the checkout.
    src = tmp_path_factory.mktemp("src") / "pointsman"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("pointsman-*.whl")
    return path


def test_every_module_lives_under_pointsman(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops - {"pointsman"} == {next(t for t in tops if t.endswith(".dist-info"))}
    modules = [n for n in names if n.endswith(".py")]
    assert modules and all(n.startswith("pointsman/") for n in modules)
    for sub in SUBPACKAGES:
        assert f"pointsman/{sub}/__init__.py" in names, sub
    assert not any(n.startswith("pointsman/tests/") for n in names)


def test_wheel_carries_embedded_defaults(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "pointsman/policy/defaults/fleet.yaml" in names
    assert "pointsman/policy/defaults/policies/default.yaml" in names
    assert "pointsman/estimator/default_model/manifest.json" in names
    assert "pointsman/estimator/char_tokens.bin" in names  # billed_tokens: the non-ASCII characters' tokens
    assert "pointsman/datasets/sanity_pairs.jsonl" in names  # evaluate --pairs sanity, the promotion gate


def test_installed_wheel_imports_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    """Unpacked wheel first on sys.path: every subpackage imports from it, not from the checkout."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import importlib, pathlib, sys\n"
        f"for sub in {SUBPACKAGES!r}:\n"
        "    mod = importlib.import_module('pointsman.' + sub)\n"
        f"    assert pathlib.Path(mod.__file__).is_relative_to({str(site)!r}), (sub, mod.__file__)\n"
    )
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_no_installed_package_is_shadowed_by_xds_protos() -> None:
    """xds-protos (the ext-proc extra) overwrites opentelemetry-proto's and common-expression-language's
    files when installed after them; ``make install-train`` runs scripts/fix_shadowed_packages.py to
    give them back. MLflow's tracing imports TracesData, the CEL package exports compile."""
    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "fix_shadowed_packages.py"), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    probe = ("import cel; assert callable(cel.compile)\n"
             "import importlib.util as u\n"
             "if u.find_spec('opentelemetry.proto') is not None:\n"
             "    from opentelemetry.proto.trace.v1.trace_pb2 import TracesData\n"
             "from envoy.service.ext_proc.v3 import external_processor_pb2\n")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
