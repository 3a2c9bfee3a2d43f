"""Policy size limits (policy/rules/limits.py): oversized input is rejected early with a located
``too-large`` problem; anchors and aliases of ordinary size keep working."""

from pathlib import Path

import pytest

from pointsman.errors import PolicyError
from pointsman.located import parse_yaml
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import compile_policy, load_policy
from pointsman.policy.rules.limits import MAX_POLICY_BYTES, MAX_RULES, MAX_TENANT_ENTRIES, MAX_YAML_NODES

HEAD = "apiVersion: pointsman/v1\nkind: RoutingPolicy\n"
DEFAULT_RULE = "  - name: default\n    route: {target: onprem-8b}\n"


@pytest.fixture(scope="module")
def fleet():
    return load_fleet()


def rejected(text: str, fleet, file: str = "p.yaml") -> list[str]:
    with pytest.raises(PolicyError) as info:
        compile_policy(text, fleet, file)
    return [str(p) for p in info.value.problems]


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """"Billion laughs": each level lists ``width`` aliases of the one below (9**8 leaves)."""
    lines = [HEAD, "variables:\n", '  l0: &l0 ["lol"]\n']
    for k in range(1, levels):
        lines.append(f"  l{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * width) + "]\n")
    return "".join(lines) + "rules:\n" + DEFAULT_RULE


def many_rules(n: int) -> str:
    """``n`` rules sharing one anchored route and one merged base mapping, the last unconditional."""
    body = ["  - name: r0\n    when: request.prompt_tokens > 0\n"
            "    route: &big {target: onprem-70b, fallbacks: [frontier-small]}\n"
            "    labels: &base {team: search}\n"]
    body += [f"  - name: r{i}\n    when: request.prompt_tokens > {i}\n    route: *big\n"
             f"    labels: {{<<: *base, n: '{i}'}}\n" for i in range(1, n - 1)]
    return HEAD + "rules:\n" + "".join(body) + DEFAULT_RULE


def test_alias_bomb_is_rejected_at_the_alias_that_passes_the_node_limit(fleet):
    [problem] = rejected(alias_bomb(), fleet)
    # l4 holds 9 * (9 * (9 * (9 * 2 + 1) + 1) + 1) + 1 = 13,942 nodes; the fourth use of *l4 passes 50,000
    assert problem.startswith("p.yaml:9:") and ": too-large: " in problem
    assert f"passes {MAX_YAML_NODES:,} YAML nodes at alias *l4" in problem


def test_a_recursive_alias_is_rejected_instead_of_looping(fleet):
    [problem] = rejected(HEAD + "variables:\n  a: &a [1, *a]\nrules:\n" + DEFAULT_RULE, fleet)
    assert problem.startswith("p.yaml:4:13: too-large: alias *a is used inside the node it names")


def test_nodes_are_counted_with_aliases_expanded():
    text = "a: &x [1, 2]\nb: *x\n"  # root, a, [1, 2] (3 nodes), b, *x (3 nodes again) = 9
    assert parse_yaml(text, "n.yaml", PolicyError, max_nodes=9).data == {"a": [1, 2], "b": [1, 2]}
    with pytest.raises(PolicyError) as info:
        parse_yaml(text, "n.yaml", PolicyError, max_nodes=8)
    assert str(info.value).startswith("n.yaml:2:4: too-large: the document passes 8 YAML nodes at alias *x")


def test_too_many_rules_are_rejected_at_the_first_one_past_the_limit(fleet):
    text = many_rules(MAX_RULES + 1)
    [problem] = rejected(text, fleet)
    line = text.splitlines().index("  - name: default") + 1  # rule MAX_RULES + 1
    assert problem == (f"p.yaml:{line}:5: too-large: {MAX_RULES + 1:,} rules; the limit is {MAX_RULES:,} "
                       f"and this is rule {MAX_RULES + 1:,}")


def test_a_policy_at_the_rule_and_byte_limits_with_anchors_compiles(fleet):
    text = many_rules(MAX_RULES)
    text += "#" * (MAX_POLICY_BYTES - len(text.encode()) - 1) + "\n"  # exactly MAX_POLICY_BYTES
    policy = compile_policy(text, fleet, "p.yaml")
    assert len(policy.rules) == MAX_RULES
    r = policy.rules[MAX_RULES - 2]  # built from the anchored route and the merged labels
    assert (r.target, r.fallbacks, r.labels) == ("onprem-70b", ("frontier-small",),
                                                 {"team": "search", "n": str(MAX_RULES - 2)})
    [problem] = rejected(text + "\n", fleet)
    last = text.count("\n") + 1
    assert problem.startswith(f"p.yaml:{last}:1: too-large: {MAX_POLICY_BYTES + 1:,} bytes; the limit is "
                              f"{MAX_POLICY_BYTES:,} bytes")


def test_an_oversized_file_is_rejected_without_compiling(fleet, tmp_path: Path):
    path = tmp_path / "big.yaml"
    path.write_text(HEAD + "rules:\n" + DEFAULT_RULE * 20_000, encoding="utf-8")
    with pytest.raises(PolicyError) as info:
        load_policy(path, fleet)
    [problem] = info.value.problems
    assert (problem.file, problem.code) == (str(path), "too-large")
    assert problem.line > 1 and f"{path.stat().st_size:,} bytes" in problem.message


def test_too_many_tenant_names_are_rejected(fleet):
    names = ", ".join(f"t{i}" for i in range(MAX_TENANT_ENTRIES // 2 + 1))
    text = HEAD + f"filters:\n  tenants:\n    onprem-8b: [{names}]\n    onprem-70b: [{names}]\nrules:\n" + DEFAULT_RULE
    [problem] = rejected(text, fleet)
    assert problem.startswith("p.yaml:6:5: too-large: the tenant allow-lists pass 10,000 names in all at 'onprem-70b'")
