"""The goodput search against a case whose answer is known in closed form, and its parts."""

from __future__ import annotations

import math

import pytest

from pointsman.datasets.traces import TraceRequest
from pointsman.estimator.estimate import DifficultyEstimate, FixedDifficulty
from pointsman.estimator.features import RequestFeatures
from pointsman.replay.goodput import (
    MemoEstimator,
    attainment,
    frontier_guard,
    mean_rate,
    meets,
    on_prem_only,
    scaled,
    search,
)
from pointsman.replay.hardware import FrontierSpec, ReplicaSpec
from pointsman.replay.router import Assignment
from pointsman.replay.sim_fleet import OnPremTarget, SimFleet
from pointsman.replay.simulator import simulate
from pointsman.replay.summary import SLO

# A step prefills exactly one 100-token prompt (token budget 100) in max(0.010, 100 x 0.001) =
# S = 0.100 s, and a one-token answer completes with it: a D/D/1 queue with service time S.
SPEC = ReplicaSpec(name="t", gpus=2, kv_capacity_blocks=100, kv_bytes_per_token=1000, prefill_s_per_token=0.001,
                   prefill_s_per_token_pair=0.0, decode_base_s=0.010, decode_per_seq_s=0.001,
                   decode_per_kv_token_s=0.0, block_tokens=10, kv_block_tokens=10, max_num_seqs=8,
                   max_num_batched_tokens=100)
FLEET = SimFleet(on_prem=(OnPremTarget(name="op", replica=SPEC, aggregated_replicas=1),),
                 frontier=(FrontierSpec(name="fr"),), spill_target="fr")
S = 0.100


def make():
    return (lambda r, v: Assignment("op")), None, None


def test_search_finds_the_analytic_goodput() -> None:
    # N requests every d seconds: if d < S request i waits i*(S - d), so TTFT_i = S + i*(S - d).
    # With TTFT SLO T it meets iff i <= (T - S)/(S - d); 90% of N = 10 means i = 0..8 meet:
    # (T - S)/(S - d) >= 8, i.e. d >= S - (T - S)/8. T = 0.28 s: d* = 0.0775 s. The search's
    # rate is N / (last - first arrival) = N / ((N - 1) d): 10 / (9 * 0.0775) = 14.34 req/s. That
    # rate only lasts 10 requests: the replica's work over the arrival span, N S / ((N - 1) d) = rate x S,
    # is 1.43; a point passes only at load <= 1, so the goodput is min(14.34, 1 / S) = 10 req/s.
    n, spacing = 10, 0.100
    trace = [TraceRequest(i * spacing, 100, 1) for i in range(n)]
    slo = SLO(ttft_s=0.28, tpot_s=1.0)
    found = search(trace, make, FLEET, slo, rel_tol=0.02)
    burst = n / ((n - 1) * (S - (slo.ttft_s - S) / 8))
    best = min(burst, 1 / S)
    assert found.base_rate_rps == pytest.approx(n / ((n - 1) * spacing))
    assert best / 1.02 <= found.max_goodput_rps <= best * (1 + 1e-9)  # before the load test: 14.34
    assert found.max_goodput_rps_per_gpu == pytest.approx(found.max_goodput_rps / 2)  # the replica has 2 GPUs
    assert found.points[0].scale == 1.0 and found.points[0].attainment == 1.0
    passing = [p for p in found.points if p.passed]
    assert all(p.attainment >= 0.9 and p.complete and p.load <= 1.0 for p in passing)
    assert max(p.rate_rps for p in passing) == found.max_goodput_rps
    assert any(p.attainment >= 0.9 and p.load > 1.0 and not p.passed for p in found.points)


def test_search_halves_below_the_trace_rate_and_reports_zero_when_nothing_passes() -> None:
    trace = [TraceRequest(i * 0.05, 100, 1) for i in range(10)]  # twice what the replica serves
    found = search(trace, make, FLEET, SLO(ttft_s=0.28, tpot_s=1.0), rel_tol=0.02)
    assert found.points[0].scale == 1.0 and found.points[1].scale == 0.5
    assert 0 < found.max_goodput_rps < found.base_rate_rps
    impossible = search(trace, make, FLEET, SLO(ttft_s=0.05, tpot_s=1.0), min_scale=0.25)  # TTFT < S
    assert impossible.max_goodput_rps == 0.0 and [p.scale for p in impossible.points] == [1.0, 0.5, 0.25]


def test_a_replay_stops_once_it_cannot_pass() -> None:
    trace = [TraceRequest(0.0, 100, 1) for _ in range(30)]  # all at once: the 3rd already waits 0.2 s
    att, complete, _ = attainment(trace, FLEET, make, SLO(ttft_s=0.15, tpot_s=1.0))
    assert not complete and att == pytest.approx((30 - 4) / 30)  # stopped at the 4th failure (3 allowed)


def test_scaling_and_rates() -> None:
    trace = [TraceRequest(10.0, 5, 1), TraceRequest(12.0, 5, 1), TraceRequest(14.0, 5, 1)]
    assert [r.arrival_s for r in scaled(trace, 2.0)] == [10.0, 11.0, 12.0]
    assert mean_rate(trace) == pytest.approx(3 / 4) and mean_rate(scaled(trace, 2.0)) == pytest.approx(1.5)
    assert math.isinf(mean_rate(trace[:1]))


def test_meets_both_objectives() -> None:
    (r,) = simulate([TraceRequest(0.0, 100, 3)], FLEET, lambda q, v: Assignment("op")).requests
    # TTFT 0.100 s, TPOT 0.010 s
    assert meets(r, SLO(0.101, 0.0101)) and not meets(r, SLO(0.099, 0.0101)) and not meets(r, SLO(0.101, 0.0099))


def test_frontier_disabled() -> None:
    view = None
    guard = frontier_guard(lambda q, v: Assignment("fr", fallbacks=(Assignment("op"),)), FLEET)
    assert guard(TraceRequest(0.0, 10, 1), view) == Assignment("op")  # type: ignore[arg-type]
    guard = frontier_guard(lambda q, v: Assignment("fr"), FLEET)
    assert guard(TraceRequest(0.0, 10, 1), view).rejected == "frontier_disabled"  # type: ignore[arg-type]
    guard = frontier_guard(lambda q, v: Assignment("op", fallbacks=(Assignment("fr"),)), FLEET)
    assert guard(TraceRequest(0.0, 10, 1), view) == Assignment("op")  # type: ignore[arg-type]
    assert on_prem_only(FLEET).spill_target is None


def test_memo_estimator_answers_each_prompt_once() -> None:
    calls = []

    class Counting(FixedDifficulty):
        def estimate(self, features: RequestFeatures) -> DifficultyEstimate:
            calls.append(features.query_text)
            return super().estimate(features)

    memo = MemoEstimator(Counting(0.4))
    f = RequestFeatures(10, 3, True, 1, 1, 0, 10, "hello", False, False, 0, 0, None)
    g = RequestFeatures(10, 3, True, 1, 1, 0, 10, "other", False, False, 0, 0, None)
    assert [memo.estimate(x).p_hard for x in (f, f, g, f)] == [0.4] * 4
    assert calls == ["hello", "other"] and not memo.takes_query_token_ids


def test_slo_floor_names_what_no_rate_fixes_and_bounds_every_search_point() -> None:
    """7 prompts of 100 tokens (one 0.1 s step), 2 of 300 (three chunks: 0.3 s idle) and one longer
    than the context window, against a 0.25 s TTFT: at most 70% can meet it at any rate, so the
    goodput is 0, and no replay point of the search beats the floor."""
    import dataclasses

    from pointsman.replay.goodput import idle_prefill_s, slo_floor

    spec = dataclasses.replace(SPEC, max_model_len=1000)
    fleet = SimFleet(on_prem=(OnPremTarget(name="op", replica=spec, aggregated_replicas=1),))
    lengths = [100] * 7 + [300, 300, 2000]
    trace = [TraceRequest(arrival_s=float(i), prompt_tokens=n, output_tokens=1) for i, n in enumerate(lengths)]
    assert idle_prefill_s(spec, 100) == pytest.approx(S) and idle_prefill_s(spec, 300) == pytest.approx(3 * S)
    slo = SLO(ttft_s=0.25, tpot_s=1.0)
    floor = slo_floor(trace, fleet, slo)
    assert (floor.too_long, floor.prefill_over_ttft, floor.decode_over_tpot) == (1, 2, 0)
    assert floor.best_attainment == pytest.approx(0.7) and floor.over_ttft_by_target == {"op": pytest.approx(0.3)}
    assert "at most 70.0% can meet the SLO at any rate" in floor.sentence()
    def route():  # noqa: ANN202 - a RouterFactory
        return (lambda r, v: Assignment("op")), None, None

    found = search(trace, route, fleet, slo)
    assert found.max_goodput_rps == 0 and found.points
    for x in (1.0, 1 / 64, 64.0):  # whole replays (goal 0 never stops early): never above the floor
        att, complete, _ = attainment(scaled(trace, x), fleet, route, slo, goal=0.0)
        assert complete and att <= floor.best_attainment + 1e-9
    with pytest.raises(ValueError):
        slo_floor([], fleet, slo)
