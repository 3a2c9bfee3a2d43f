"""Trace replay: run the real engine and policy over a real trace against a
simulated fleet, next to baselines, and report cost, latency and quality.

Modules, in data-flow order:

- ``hardware``: replica latency/KV specs derived from model configs and GPU datasheets;
  P/D link, shared KV tier and frontier tier specs.
- ``fleet``: ``SimFleet`` of on-prem targets (aggregated and/or P/D pools) and frontier tiers.
- ``kvcache``: per-replica ``PrefixCache`` (block hashes, pins, LRU) and the shared tier's store.
- ``simulator``: ``simulate(trace, fleet, router, seed=)`` -> ``ReplayResult``; the
  router interface (``Assignment``, ``FleetView``, ``ReplicaView``).
- ``baselines``: round-robin, random, least-loaded, cache-aware routers.
- ``metrics``: ``summarize(result, slo)`` -> ``Summary``; ``format_table``.

Traces are loaded by ``pointsman.datasets.traces``.
"""
