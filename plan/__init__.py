"""Capacity planning (``pointsman plan``): fleet shapes searched by replaying a trace with the real
engine and policy, priced per month, reported as a Pareto front (``docs/plan.md``).

Rooms, lowest first: ``prices`` (GPU list prices and datasheet power, DRAM, hours per month),
``shapes`` (a fleet shape and the fleet file it becomes), ``evaluate`` (one shape replayed and
priced; the worker processes), ``front`` (Pareto front and the recommendation), ``search`` (the
pruned search under a time budget), ``report`` (text, JSON, PNG, HTML). Serving and replay never
import this package (``pyproject.toml``'s import contracts).
"""
