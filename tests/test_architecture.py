"""The layout docs/architecture.md draws, checked: imports run one way (import-linter's
contracts in pyproject.toml, on the installed layout staged by scripts/check_types.py), a
planted import against the order is caught, and the error tree in ``pointsman.errors`` names
every error the package defines."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import pointsman
from pointsman.errors import PointsmanError

ROOT = Path(__file__).resolve().parent.parent


def _check_types():
    spec = importlib.util.spec_from_file_location("check_types", ROOT / "scripts" / "check_types.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_imports_follow_the_drawn_order(tmp_path):
    ct = _check_types()
    done = ct.lint_imports(ct.stage(tmp_path))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Contracts: 4 kept, 0 broken." in out


@pytest.mark.parametrize("probe, contract", [
    ("service/_probe.py", "import pointsman.training.train\n"),        # serving importing training
    ("policy/signals/_probe.py", "import pointsman.policy.engine\n"),   # a room importing one above it
    ("estimator/_probe.py", "import pointsman.policy.fleet\n"),         # a package importing one above it
])
def test_an_import_against_the_order_is_caught(tmp_path, probe, contract):
    ct = _check_types()
    done = ct.lint_imports(ct.stage(tmp_path, extra={probe: contract}))
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "BROKEN" in out and "_probe" in out


def _all_modules():
    names = []
    for info in pkgutil.walk_packages(pointsman.__path__, "pointsman."):
        names.append(info.name)
    for sub in ("estimator", "policy", "training", "service", "datasets", "replay", "plan", "integrations", "outcome_log", "cli"):
        pkg = importlib.import_module(f"pointsman.{sub}")
        names += [i.name for i in pkgutil.walk_packages(pkg.__path__, f"pointsman.{sub}.")]
    return sorted(set(names))


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_the_error_tree_names_every_error():
    for name in _all_modules():
        if name.endswith("__main__"):
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:  # an optional extra (litellm) may be absent
            if "litellm" in str(exc):
                continue
            raise
    doc = importlib.import_module("pointsman.errors").__doc__
    defined = {c.__name__ for c in _subclasses(PointsmanError) if c.__module__.startswith("pointsman")
               and not c.__name__.startswith("_")}
    missing = sorted(n for n in defined if n not in doc)
    assert not missing, f"pointsman.errors' tree does not list {missing}"
