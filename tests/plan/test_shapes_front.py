"""Fleet shapes written as fleet files, their price floors, and the Pareto front / recommendation
(no replay: fast)."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.plan.evaluate import ShapeResult
from pointsman.plan.front import dominates, pareto_front, recommend
from pointsman.plan.prices import GPU_PRICES, HOURS_PER_MONTH, kv_tier_usd_per_month
from pointsman.plan.shapes import Pools, ShapeSpace
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet, parse_fleet
from pointsman.replay.fleet_map import sim_fleet


def _space(**kw: object) -> ShapeSpace:
    fleet = load_fleet(DEFAULT_FLEET_PATH)
    doc = yaml.safe_load(DEFAULT_FLEET_PATH.read_text(encoding="utf-8"))
    kv = {t.name: t.replica.kv_bytes_per_token for t in sim_fleet(fleet).on_prem}
    return ShapeSpace.of(doc, fleet, kv, **kw)  # type: ignore[arg-type]


def test_base_shape_is_the_packaged_fleet() -> None:
    space = _space()
    assert space.label(space.base) == "onprem-8b A2 | onprem-70b A2 P2 D4 KV1.5M"
    assert space.gpus_of(space.base) == 18
    assert space.fleet_text(space.base).count("name: llama-70b-decode-") == 4


def test_a_shape_becomes_a_valid_fleet_file_with_its_counts_tier_and_gpu() -> None:
    space = _space(gpus=("H200-SXM",))
    shape = space.base.with_pools("onprem-70b", Pools(1, 6, 1, 0)).with_pools("onprem-8b", Pools(3))
    from dataclasses import replace

    shape = replace(shape, gpu="H200-SXM")
    fleet = parse_fleet(space.fleet_text(shape, "a header", {"reproduce": "pointsman replay x"}))
    big = fleet.targets["onprem-70b"]
    pools = big.pools_by_role()  # type: ignore[union-attr]
    assert [len(pools[r].endpoints) for r in ("aggregated", "prefill", "decode")] == [1, 6, 1]
    names = [e.name for e in pools["prefill"].endpoints]
    assert names == [f"llama-70b-prefill-{i}" for i in range(6)] and len(set(fleet.endpoints)) == len(fleet.endpoints)
    assert big.shared_kv is None  # tier level 0: no tier
    assert big.replay is not None and big.replay.gpu == "H200-SXM"
    assert big.usd_per_gpu_hour == GPU_PRICES["H200-SXM"].usd_per_gpu_hour
    assert pools["decode"].kv_cache_capacity_tokens > 220000  # 61 GB more HBM per GPU
    assert fleet.spec.metadata.labels["reproduce"] == "pointsman replay x"
    assert sim_fleet(fleet).on_prem[1].prefill_replicas == 6


def test_floor_is_gpu_rent_idle_power_and_tier_dram() -> None:
    space = _space()
    tier = kv_tier_usd_per_month(1_500_000, 327680)
    # Compute Engine's $0.004237 per "GB"-hour is per 2^30 bytes: 1 GiB of tier (2^15 tokens of 32 KiB) costs
    # exactly that a month; per 10^9 bytes it was 7.4% more (1.0737 x)
    assert kv_tier_usd_per_month(2**15, 2**15) == pytest.approx(0.004237 * HOURS_PER_MONTH, rel=1e-12)
    assert tier == pytest.approx(1_500_000 * 327680 / 2**30 * 0.004237 * HOURS_PER_MONTH, rel=1e-12)
    assert space.floor_usd_per_month(space.base) == 18 * 2.5 * HOURS_PER_MONTH + tier  # the GPU-hour price includes power


def test_neighbors_are_valid_and_one_step_away() -> None:
    space = _space(max_replicas=4)
    around = list(space.neighbors(space.base))
    assert around and all(space.valid(s) for s in around)
    labels = {space.label(s) for s in around}
    assert "onprem-8b A2 | onprem-70b A2 P3 D3 KV1.5M" in labels  # a decode replica moved to prefill
    assert {"onprem-8b A2 | onprem-70b A2 P2 D4 KV0.75M", "onprem-8b A2 | onprem-70b A2 P2 D4 KV3M"} <= labels  # tier sizes
    assert "onprem-8b A2 | onprem-70b A8 KV1.5M" not in labels  # all 8 aggregated: above max_replicas
    assert space.covered_by(space.base.with_pools("onprem-8b", Pools(1)), space.base)


def _r(usd: float, att: float, q: float = math.nan, label: str = "") -> ShapeResult:
    space = _space()
    return ShapeResult(space.base, 1.0, label or f"{usd}/{att}", 1, usd_per_month=usd, slo_attainment=att, quality=q)


def test_a_dominated_shape_is_never_recommended_or_on_the_front() -> None:
    cheap_good = _r(100, 0.95, 0.8)
    dominated = _r(100, 0.92, 0.8)  # same cost, lower attainment
    dearer = _r(150, 0.99, 0.8)
    miss = _r(50, 0.5, 0.9)
    results = [dominated, dearer, miss, cheap_good]
    assert dominates(cheap_good, dominated) and not dominates(dearer, cheap_good)
    assert recommend(results, 0.9) is cheap_good
    front = pareto_front(results)
    assert dominated not in front and [r.usd_per_month for r in front] == [50, 100, 150]
    assert recommend(results, 0.9, budget_usd_per_month=90) is None
    assert recommend([dominated, dearer], 0.9) is dominated  # nothing better evaluated


def test_the_quality_floor_is_a_constraint_of_the_recommendation_and_the_candidates() -> None:
    from pointsman.plan.search import validation_candidates

    cheap_low = _r(100, 0.95, 0.80)
    dear_high = _r(150, 0.93, 0.93)
    unscored = _r(60, 0.99, math.nan)  # no outcome rows: its quality is unknown
    results = [cheap_low, dear_high, unscored]
    assert recommend(results, 0.9) is unscored  # no floor: the cheapest meeting the SLO
    assert recommend(results, 0.9, min_quality=0.9) is dear_high  # the floor binds
    assert recommend(results, 0.9, min_quality=0.95) is None
    assert cheap_low in pareto_front(results)  # the front is still cost x SLO x quality
    assert validation_candidates(results, 0.9, 3, min_quality=0.9) == [dear_high]
    assert validation_candidates(results, 0.9, 3) == [unscored, cheap_low, dear_high]


def test_wider_prefill_replicas_and_a_usable_small_pd_pool() -> None:
    from dataclasses import replace

    import yaml as _yaml

    from pointsman.plan.tuning import TuningSpace
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, compile_policy

    space = _space()
    space = space.with_policy(TuningSpace(_yaml.safe_load(DEFAULT_POLICY_PATH.read_text(encoding="utf-8"))))
    small = space.base.with_pools("onprem-70b", Pools(0, 1, 1, 0)).with_pools("onprem-8b", Pools(1))
    wide = small.with_pools("onprem-70b", Pools(0, 1, 1, 0, prefill_tp=2))
    assert wide in set(space.neighbors(small)) and small in set(space.neighbors(wide))
    assert space.label(wide) == "onprem-8b A1 | onprem-70b A0 P1/TP4 D1"
    assert space.gpus_of(wide) == space.gpus_of(small) + 2 == 7
    assert space.covered_by(small, wide) and not space.covered_by(wide, small)
    assert not space.valid(small.with_pools("onprem-70b", Pools(0, 1, 1, 0, prefill_tp=8)))  # 16 GPUs a replica
    fleet = parse_fleet(space.fleet_text(wide))
    big = fleet.targets["onprem-70b"]
    pools = big.pools_by_role()  # type: ignore[union-attr]
    base_pools = load_fleet(DEFAULT_FLEET_PATH).targets["onprem-70b"].pools_by_role()  # type: ignore[union-attr]
    assert pools["prefill"].gpus_per_replica == 4 and pools["decode"].gpus_per_replica == 2
    assert pools["prefill"].prefill_tokens_per_s == 2 * base_pools["prefill"].prefill_tokens_per_s
    assert pools["prefill"].kv_cache_capacity_tokens > 2 * base_pools["prefill"].kv_cache_capacity_tokens
    assert big.default_mode == "disaggregated"  # no aggregated pool left: the fleet's default mode follows
    sim = sim_fleet(fleet).on_prem[1]
    assert sim.spec_for("prefill").gpus == 4 and sim.spec_for("decode").gpus == 2
    # a 6-GPU P/D pool is below the default policy's 12-GPU guard: the planned policy lowers it,
    # so the pool it rents is one the policy may use; the packaged shape keeps the policy as written
    assert space.pd_guard(wide) == 6 and not space.policy_as_written(wide)
    policy = compile_policy(space.policy_text(wide), fleet, "planned.yaml")
    assert policy.disaggregation.min_pool_gpus == 6
    assert space.pd_guard(space.base) is None and space.policy_as_written(space.base)
    assert space.pd_guard(replace(small, pools=small.with_pools("onprem-70b", Pools(2)).pools)) is None


def test_a_step_budget_and_a_dropped_target_are_shapes_of_the_search() -> None:
    import yaml as _yaml

    from pointsman.errors import PolicyError
    from pointsman.plan.tuning import TuningSpace
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, STATIC_POLICY_PATH, compile_policy

    space = _space()
    space = space.with_policy(TuningSpace(_yaml.safe_load(DEFAULT_POLICY_PATH.read_text(encoding="utf-8"))))
    small = space.base.with_pools("onprem-70b", Pools(1)).with_pools("onprem-8b", Pools(1))
    chunked = small.with_pools("onprem-70b", Pools(1, max_num_batched_tokens=512))
    alone = chunked.with_pools("onprem-8b", Pools(0))
    around = set(space.neighbors(small))
    assert chunked in around and small.with_pools("onprem-8b", Pools(0)) in around  # one step each
    assert alone in set(space.neighbors(chunked))
    assert space.label(alone) == "onprem-8b none | onprem-70b A1 B512"
    assert space.gpus_of(alone) == 2 and space.floor_usd_per_month(alone) < space.floor_usd_per_month(chunked)
    assert not space.covered_by(small, chunked) and not space.covered_by(chunked, small)  # budgets differ
    assert not space.valid(alone.with_pools("onprem-70b", Pools(0)))  # some on-prem target stays
    assert not space.valid(small.with_pools("onprem-70b", Pools(1, max_num_batched_tokens=300)))
    fleet = parse_fleet(space.fleet_text(alone))
    assert list(fleet.targets) == ["onprem-70b", "frontier-small", "frontier-large"]
    pools = fleet.targets["onprem-70b"].pools_by_role()  # type: ignore[union-attr]
    assert pools["aggregated"].max_num_batched_tokens == 512
    assert sim_fleet(fleet).on_prem[0].replica.max_num_batched_tokens == 512  # the simulator steps with it
    # the default policy compiles without the 8B model (its 8B rules are if_fleet_has), the
    # static one does not: the search skips such a shape as invalid
    policy = compile_policy(space.policy_text(alone), fleet, "planned.yaml")
    assert [name for name, _ in policy.omitted] == ["onprem-8b-in-slo", "onprem-8b-first"]
    assert "onprem-8b" not in {t for r in policy.rules for t, _ in r.candidates}
    with pytest.raises(PolicyError, match="unknown-target"):
        compile_policy(STATIC_POLICY_PATH.read_text(encoding="utf-8"), fleet, "static.yaml")


def test_a_quality_short_near_miss_tries_the_settings_that_buy_quality_first() -> None:
    from pointsman.plan.search import _priority
    from pointsman.plan.tuning import Knob, TuningSpace

    knobs = (Knob("p_hard_frontier", (0.5, 0.67, 0.8), 1), Knob("hard_prompt_max_usd", (0.004, 0.008, 1000.0), 2),
             Knob("verify.prefix_tokens", (16.0, 32.0), 1))
    space = _space().with_policy(TuningSpace({"variables": {}}, knobs))
    here = (1, 1, 1)
    assert space.policy.toward_quality(here, (0, 1, 1)) and not space.policy.toward_quality(here, (2, 1, 1))
    assert space.policy.toward_quality(here, (1, 2, 1)) and not space.policy.toward_quality(here, (1, 0, 1))
    assert not space.policy.toward_quality(here, (1, 1, 0))
    from dataclasses import replace as _replace

    current = ShapeResult(_replace(space.base, tuning=here), 1.0, "x", 18, usd_per_month=1.0, slo_attainment=1.0,
                          quality=0.9)
    order = sorted(space.policy.neighbors(here),
                   key=lambda t: _priority(space, current, _replace(space.base, tuning=t), True, True))
    assert order[:2] == [(0, 1, 1), (1, 2, 1)]  # a lower threshold, a higher cap: more on the frontier


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-1, 9), min_size=1, max_size=6).map(sorted), st.integers(1, 3),
       st.lists(st.floats(0, 100), min_size=66, max_size=66))
def test_the_threshold_staircase_finds_each_caps_highest_qualifying_threshold(
        edge: list[int], k: int, noise: list[float]) -> None:
    """A monotone quality floor on a grid of 10 thresholds x len(edge) caps: at cap c the
    thresholds 0..edge[c] qualify (a higher cap qualifies at least as high: ``edge`` sorted). The
    staircase probes each cap it visits until it knows that cap's edge exactly, visits caps from the
    highest down, stops at a cap where nothing qualifies, and needs far fewer replays than the grid;
    with the cost falling with the cap (as on a trace where a cap saves frontier spend) it visits
    every cap down to the first where nothing qualifies."""

    from pointsman.plan.search import staircase
    from pointsman.plan.shapes import Shape
    from pointsman.plan.tuning import Knob, TuningSpace

    caps = len(edge)
    policy = TuningSpace({"variables": {}}, (Knob("p_bad_escalate", (0.4, 1.0), 1),
                                             Knob("p_hard_frontier", tuple(i / 10 for i in range(10)), 5),
                                             Knob("hard_prompt_max_usd", tuple(float(c) for c in range(caps)), caps - 1)))
    assert policy.threshold_axes() == (1, 2)
    shape = Shape((), "H100-SXM", (0, 5, caps - 1))
    probed: list[tuple[int, int]] = []

    def probe(shapes: list[Shape]) -> bool:
        assert 1 <= len(shapes) <= k and all(s.tuning[0] == 0 for s in shapes)  # other knobs kept
        probed.extend((s.tuning[1], s.tuning[2]) for s in shapes)
        return True

    def ok(s: Shape) -> bool:
        assert (s.tuning[1], s.tuning[2]) in probed  # only replayed shapes are read
        return s.tuning[1] <= edge[s.tuning[2]]

    def usd(s: Shape) -> float:  # cheaper at a higher threshold and a lower cap
        return 1000.0 - 10 * s.tuning[1] + 100 * s.tuning[2] + noise[s.tuning[1] * 6 + s.tuning[2]] / 1000
    assert staircase(shape, policy, probe, ok, usd, k)
    visited = sorted({c for _, c in probed}, reverse=True)
    expect = [c for c in range(caps - 1, -1, -1) if c == caps - 1 or edge[c + 1] >= 0]
    assert visited == expect
    top = 9  # the highest threshold that may qualify at the next cap down: the edge of the cap above
    for c in visited:
        at = {t for t, cc in probed if cc == c}
        if edge[c] < 0:
            assert 0 in at
        else:  # the edge is known: it qualified, and the next threshold up failed (or could not qualify)
            assert edge[c] in at and (edge[c] == top or edge[c] + 1 in at)
            top = edge[c]
    assert len(probed) <= caps * 5 and len(probed) == len(set(probed))
    assert not staircase(shape, policy, lambda shapes: False, ok, usd, k)
