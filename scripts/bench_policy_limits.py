#!/usr/bin/env python
"""How long compiling takes to reject an oversized policy (``policy/rules/limits.py``), and what
compiling the largest accepted one costs, on one core.

Inputs: an alias bomb ("billion laughs": 9 levels of 9 aliases, 567 bytes, ~4e8 nodes
expanded); a 20,000-rule policy (2.9 MB), as text (``compile_policy``, what
``POST /v1/policy/validate`` runs) and as a file (``load_policy``: CLI, reload, file watch);
the worst cases under the byte limit (``MAX_POLICY_BYTES`` of one-character list items, which
stops at the node limit; as many rules, which stop at the rule limit); and ``MAX_RULES`` rules (accepted).

    python scripts/bench_policy_limits.py [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pointsman.errors import PolicyError
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import compile_policy, load_policy
from pointsman.policy.rules.limits import MAX_POLICY_BYTES, MAX_RULES

HEAD = "apiVersion: pointsman/v1\nkind: RoutingPolicy\n"
DEFAULT = "  - name: default\n    route: {target: onprem-8b}\n"


def rules_yaml(n: int) -> str:
    """A policy of ``n`` rules (``n - 1`` conditional ones, then the default), ~140 bytes each."""
    body = "".join(f"  - name: r{i}\n    when: request.prompt_tokens > {i} && difficulty.p_hard > 0.5\n"
                   f"    route: {{target: onprem-70b, fallbacks: [frontier-small]}}\n" for i in range(n - 1))
    return HEAD + "rules:\n" + body + DEFAULT


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """Nested anchors, each level a list of ``width`` aliases of the level below."""
    lines = [HEAD, "variables:\n", '  l0: &l0 ["lol"]\n']
    for k in range(1, levels):
        lines.append(f"  l{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * width) + "]\n")
    return "".join(lines) + "rules:\n" + DEFAULT


def flat_list(size: int) -> str:
    """A variable holding a flow list of one-character items, ``size`` bytes in all."""
    head = HEAD + "rules:\n" + DEFAULT + "variables:\n  big: ["
    return head + ",".join(["1"] * ((size - len(head) - 2) // 2)) + "]\n"


def timed(fn: Callable[[], object]) -> tuple[float, str]:
    """(seconds, first problem or 'accepted') for one call."""
    start = time.perf_counter()
    try:
        fn()
        outcome = "accepted"
    except PolicyError as exc:
        outcome = str(exc.problems[0])
    return time.perf_counter() - start, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    fleet = load_fleet()
    under = MAX_POLICY_BYTES * 1000 // len(rules_yaml(1000).encode())  # as many rules as fit the byte limit
    while len(rules_yaml(under).encode()) > MAX_POLICY_BYTES:
        under -= 10
    cases = {
        "alias bomb (text)": alias_bomb(),
        "20,000 rules (text)": rules_yaml(20_000),
        f"{MAX_POLICY_BYTES // 1024} KiB of list items (text)": flat_list(MAX_POLICY_BYTES),
        f"{under:,} rules, just under {MAX_POLICY_BYTES // 1024} KiB (text)": rules_yaml(under),
        f"{MAX_RULES:,} rules (text, the limit)": rules_yaml(MAX_RULES),
    }
    results = {}
    for name, text in cases.items():
        seconds, outcome = timed(lambda: compile_policy(text, fleet, "bench.yaml"))
        results[name] = {"bytes": len(text.encode()), "seconds": round(seconds, 4), "outcome": outcome[:160]}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.yaml"
        path.write_text(rules_yaml(20_000), encoding="utf-8")
        seconds, outcome = timed(lambda: load_policy(path, fleet))
        results["20,000 rules (file)"] = {"bytes": path.stat().st_size, "seconds": round(seconds, 4),
                                          "outcome": outcome[:160].replace(str(path), "big.yaml")}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name, r in results.items():
        print(f"{name:42s} {r['bytes']:>10,} B {r['seconds'] * 1000:>9.1f} ms  {r['outcome']}")


if __name__ == "__main__":
    main()
