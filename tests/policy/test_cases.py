"""Every shipped policy passes its sibling cases file; the runner reports mismatches."""

from pathlib import Path

import pytest

from pointsman.errors import PolicyError
from pointsman.policy.cases import run_cases
from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR

CASES = sorted(DEFAULT_POLICY_DIR.glob("*.cases.yaml"))


def test_every_shipped_policy_has_cases():
    policies = {p.name.removesuffix(".yaml") for p in DEFAULT_POLICY_DIR.glob("*.yaml") if not p.name.endswith(".cases.yaml")}
    assert policies and policies == {p.name.removesuffix(".cases.yaml") for p in CASES}


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_shipped_cases_pass(path):
    results = run_cases(path)
    assert results
    failed = [f"{r.name}: {r.message}" for r in results if not r.passed]
    assert not failed


def test_a_wrong_expectation_fails_with_a_message(tmp_path: Path):
    (tmp_path / "p.yaml").write_text((DEFAULT_POLICY_DIR / "static.yaml").read_text())
    (tmp_path / "p.cases.yaml").write_text(
        "apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
        "  - name: wrong\n    signals: {difficulty: {p_hard: 0.9}}\n    expect: {target: onprem-8b, rule: default}\n")
    [r] = run_cases(tmp_path / "p.cases.yaml")
    assert not r.passed
    assert r.message == "target: expected 'onprem-8b', got 'frontier-large'; rule: expected 'default', got 'hard-prompt'"


def test_unknown_signal_in_a_case_is_a_located_error(tmp_path: Path):
    (tmp_path / "p.yaml").write_text((DEFAULT_POLICY_DIR / "static.yaml").read_text())
    path = tmp_path / "p.cases.yaml"
    path.write_text("apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
                    "  - name: typo\n    signals:\n      difficulty: {phard: 0.9}\n    expect: {target: onprem-8b}\n")
    with pytest.raises(PolicyError, match=r"p.cases.yaml:7:20: unknown-signal: unknown signal 'difficulty.phard'; did you mean 'p_hard'\?"):
        run_cases(path)
