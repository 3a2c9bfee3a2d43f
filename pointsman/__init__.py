"""Pointsman: a routing policy engine for LLM inference.

For each request Pointsman decides which model tier (on-prem open model or
frontier API), which pool (aggregated or prefill/decode-disaggregated) and which
replica serves it, from four signals: difficulty (a learned estimator), load,
KV-cache locality and budget. See DESIGN.md for the flow of one decision.

The design card's folders install as subpackages of this one:
``pointsman.estimator``, ``pointsman.policy``, ``pointsman.training``,
``pointsman.service`` and ``pointsman.datasets``.
"""

__version__ = "0.1.0"
