"""Size limits on a policy, checked before the costly part of compiling it.

Compiling is pure Python under the GIL (PyYAML composes about 70,000 nodes/s, a rule's
CEL compile and type probes cost about 1 ms), so an oversized policy posted to
``POST /v1/policy/validate`` or written to the watched file would slow every decision the
process serves while it compiles. ``compile_policy`` and ``load_policy`` (and so
``pointsman policy check``, validate, reload and the file watch) reject, with code
``too-large`` located as ``file:line:col``:

- ``MAX_POLICY_BYTES``: source text over 512 KiB (UTF-8 bytes; a file is not read past it);
- ``MAX_YAML_NODES``: over 50,000 YAML nodes with every alias counted as the nodes it
  repeats, at each use — counted while composing and stopped at the cap, so an alias bomb
  is rejected without being expanded (``located.parse_yaml``);
- ``MAX_RULES``: over 1,000 rules (compiling 1,000 takes about 1.1 s on one core;
  the shipped policies have 4 to 6 rules, 2-4 KB, ~150 nodes);
- ``MAX_TENANT_ENTRIES``: over 10,000 tenant names in the ``filters.tenants`` allow-lists
  (all targets together; each decision scans its target's list).

A policy of 1,000 rules of ~300 bytes and ~20 nodes each fits every limit. Rejections
take about 1 ms (alias bomb, text or a file over the byte limit) up to about 1 s (text just under
512 KiB that stops at the node or rule limit after composing). Numbers:
``scripts/bench_policy_limits.py``.
"""

from __future__ import annotations

from pointsman.errors import PolicyError, Problem
from pointsman.located import LocatedDocument

#: Largest policy source, in UTF-8 bytes (512 KiB).
MAX_POLICY_BYTES = 512 * 1024
#: Most YAML nodes in a policy, aliases expanded (each use counts the nodes it repeats).
MAX_YAML_NODES = 50_000
#: Most rules in a policy.
MAX_RULES = 1_000
#: Most tenant names in the ``filters.tenants`` allow-lists, all targets together.
MAX_TENANT_ENTRIES = 10_000


def check_counts(doc: LocatedDocument) -> None:
    """Raise ``PolicyError`` (code ``too-large``, located at the first rule or the allow-list
    past the limit) when ``doc.data`` has more than ``MAX_RULES`` rules or more than
    ``MAX_TENANT_ENTRIES`` tenant names; runs on the parsed data, before schema validation."""
    data = doc.data
    if not isinstance(data, dict):
        return
    rules = data.get("rules")
    if isinstance(rules, list) and len(rules) > MAX_RULES:
        line, col = doc.mark(("rules", MAX_RULES))
        raise PolicyError([Problem(doc.file, line, col, "too-large", f"{len(rules):,} rules; the limit is "
                                   f"{MAX_RULES:,} and this is rule {MAX_RULES + 1:,}")])
    filters = data.get("filters")
    tenants = filters.get("tenants") if isinstance(filters, dict) else None
    if isinstance(tenants, dict):
        total = 0
        for target, names in tenants.items():
            total += len(names) if isinstance(names, list) else 0
            if total > MAX_TENANT_ENTRIES:
                line, col = doc.mark(("filters", "tenants", target), key=True)
                raise PolicyError([Problem(doc.file, line, col, "too-large", f"the tenant allow-lists pass "
                                           f"{MAX_TENANT_ENTRIES:,} names in all at '{target}'")])
