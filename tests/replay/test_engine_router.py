"""The real RoutingEngine in the simulator's loop: it sees the simulated load and prefix
caches, its rejections become rejections, and its decisions are settled at completion."""

from __future__ import annotations

from pathlib import Path

from pointsman.datasets.traces import TraceRequest
from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import load_policy
from pointsman.replay.engine_router import EngineRouter
from pointsman.replay.fleet_map import sim_fleet
from pointsman.replay.simulator import simulate

FLEET = """\
apiVersion: pointsman/v1
kind: Fleet
targets:
  small:
    kind: onprem
    model: meta-llama/Llama-3.1-8B-Instruct
    context_window_tokens: 32768
    usd_per_gpu_hour: 2.5
    pools:
      aggregated:
        gpus_per_replica: 1
        prefill_tokens_per_s: 50000
        decode_tokens_per_s: 20000
        endpoints: [{name: s0, url: "http://s0/v1"}]
  api:
    kind: frontier
    provider: openai
    model: gpt-4o-mini
    base_url: https://api.openai.com/v1
    context_window_tokens: 32768
    prices: {usd_per_1m_input_tokens: 0.15, usd_per_1m_cached_input_tokens: 0.075, usd_per_1m_output_tokens: 0.6}
"""

POLICY = """\
apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: warm
    when: cache.prefix_hit_ratio >= 0.5
    route: {target: small}
  - name: queued
    when: load["small"].num_requests_waiting >= 1
    route: {target: api}
  - name: default
    route: {target: small}
"""


def req(t: float, first_block: int, p: int = 2048) -> TraceRequest:
    return TraceRequest(arrival_s=t, prompt_tokens=p, output_tokens=4,
                        block_hashes=tuple(range(first_block, first_block + -(-p // 512))))


def test_engine_reads_simulated_load_and_prefix_and_is_settled(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text(FLEET, encoding="utf-8")
    (tmp_path / "policy.yaml").write_text(POLICY, encoding="utf-8")
    fleet = load_fleet(tmp_path / "fleet.yaml")
    router = EngineRouter(fleet, load_policy(tmp_path / "policy.yaml", fleet), FixedDifficulty(0.5))
    trace = [
        req(0.0, 1),     # A: prefills at once on s0
        req(0.001, 10),  # B: queues behind A on s0 (waiting 0 when it is routed)
        req(0.002, 20),  # C: one request waiting on s0 -> api
        req(100.0, 1),   # D: A's prefix is cached on s0 -> warm
        req(100.5, 30),  # E: cold, idle fleet -> default
        TraceRequest(arrival_s=101.0, prompt_tokens=40000, output_tokens=2),  # F: longer than any context window
    ]
    result = simulate(trace, sim_fleet(fleet), router, on_complete=router.on_complete)
    rules = [router.decisions[i][0] for i in range(len(trace))]
    assert rules == ["default", "default", "queued", "warm", "default", "(no eligible target)"]
    targets = [r.target for r in result.requests]
    assert targets[:5] == ["small", "small", "api", "small", "small"]
    d = result.requests[3]
    assert d.prefix_hit_tokens == 2047  # all but the one token a prefill always computes
    assert result.requests[5].rejected == "no_eligible_target" and result.requests[5].ttft_s is None
    assert router._ids == {}  # every decision settled or released at completion


QUEUE_POLICY = """\
apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: long-prompt
    when: request.prompt_tokens > 10000
    route: {target: small}
  - name: short-wait
    when: endpoint.cost_s < 0.5
    route: {target: small}
  - name: behind-a-long-prefill
    route: {target: api}
"""


def test_queue_signal_counts_the_rest_of_a_chunked_prefill_in_progress(tmp_path: Path) -> None:
    # A (30,000 prompt tokens) starts prefilling at t = 0 in chunks of 8,192 tokens; vLLM counts
    # it as running, not waiting. B arrives 1 us later, while the first chunk is still being
    # computed (n_computed is booked at the step's end): the queue ahead of B on s0 is A's whole
    # 30,000 tokens, 30,000 / 50,000 tok/s = 0.6 s; B's own prefill 100 / 50,000 = 0.002 s and
    # its decode 4 x 2 / 20,000 = 0.0004 s: cost_s = 0.6024 >= 0.5. Hidden, it read 0.0024 s
    # and B queued for 1.1 s behind A on s0.
    (tmp_path / "fleet.yaml").write_text(FLEET, encoding="utf-8")
    (tmp_path / "policy.yaml").write_text(QUEUE_POLICY, encoding="utf-8")
    fleet = load_fleet(tmp_path / "fleet.yaml")
    router = EngineRouter(fleet, load_policy(tmp_path / "policy.yaml", fleet), FixedDifficulty(0.5))
    trace = [TraceRequest(arrival_s=0.0, prompt_tokens=30000, output_tokens=4),
             TraceRequest(arrival_s=1e-6, prompt_tokens=100, output_tokens=4)]
    result = simulate(trace, sim_fleet(fleet), router, on_complete=router.on_complete)
    assert [router.decisions[i][0] for i in range(2)] == ["long-prompt", "behind-a-long-prefill"]
    assert [r.target for r in result.requests] == ["small", "api"]


def test_an_aggregated_fallback_on_a_target_without_an_aggregated_pool_runs_on_a_decode_replica():
    """A planned fleet may give a target only P/D pools: a decision's aggregated fallback there
    (e.g. ``{target: onprem-70b, mode: auto}`` resolved aggregated) prefills locally on a decode
    replica, as the engine places it, instead of naming a pool the simulator does not have."""
    import yaml as _yaml

    from pointsman.estimator.estimate import FixedDifficulty
    from pointsman.plan.shapes import Pools, ShapeSpace
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet, parse_fleet
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
    from pointsman.replay.engine_router import EngineRouter
    from pointsman.replay.fleet_map import sim_fleet as _sim_fleet

    base = load_fleet(DEFAULT_FLEET_PATH)
    kv = {t.name: t.replica.kv_bytes_per_token for t in _sim_fleet(base).on_prem}
    space = ShapeSpace.of(_yaml.safe_load(DEFAULT_FLEET_PATH.read_text(encoding="utf-8")), base, kv)
    fleet = parse_fleet(space.fleet_text(space.base.with_pools("onprem-70b", Pools(0, 1, 1, 0))))
    router = EngineRouter(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), FixedDifficulty(0.2))
    a = router._fallback("onprem-70b", "aggregated")
    assert (a.target, a.mode, a.replica_pool) == ("onprem-70b", "aggregated", "decode")
    assert router._fallback("onprem-8b", "aggregated").replica_pool is None  # it has an aggregated pool
    assert router._fallback("frontier-small", "aggregated").mode == "aggregated"
