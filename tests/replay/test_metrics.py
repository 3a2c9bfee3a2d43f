"""summarize() on a hand-built replay result."""

from __future__ import annotations

import math

import pytest

from pointsman.replay.hardware import FrontierSpec, ReplicaSpec
from pointsman.replay.results import ReplayResult, ReplicaStats, RequestResult
from pointsman.replay.sim_fleet import OnPremTarget, SimFleet
from pointsman.replay.summary import SLO, format_table, summarize

SPEC = ReplicaSpec(
    name="test", gpus=2, kv_capacity_blocks=100, kv_bytes_per_token=1000, prefill_s_per_token=0.001,
    prefill_s_per_token_pair=0.0, decode_base_s=0.010, decode_per_seq_s=0.001, decode_per_kv_token_s=0.0,
    gpu_tdp_kw=0.72, gpu_idle_kw=0.36,
)  # fmt: skip
FLEET = SimFleet(
    on_prem=(OnPremTarget(name="op", replica=SPEC, aggregated_replicas=1, gpu_hour_usd=3.6, electricity_usd_per_kwh=0.5),),
    frontier=(FrontierSpec(name="fr"),),
)


def rr(index: int, **kw: object) -> RequestResult:
    base = dict(
        index=index, arrival_s=0.0, prompt_tokens=100, output_tokens=11, routed_target="op", target="op",
        mode="aggregated", replica=0, decode_replica=None, frontier=False, spilled=False, rejected=None,
        queue_s=0.0, ttft_s=1.0, tpot_s=0.05, e2e_s=1.5, finish_s=1.5, prefix_hit_tokens=40,
        restored_tokens=0, transfer_s=0.0, cost_usd=0.0,
    )  # fmt: skip
    base.update(kw)
    return RequestResult(**base)


def test_summary_by_hand() -> None:
    requests = [
        rr(0),  # on-prem, meets the SLO
        rr(1, target="fr", frontier=True, spilled=True, replica=None, output_tokens=1, tpot_s=None,
           ttft_s=0.5, prefix_hit_tokens=0, cost_usd=0.5, finish_s=1000.0),  # fmt: skip
        rr(2, rejected="queue_full", queue_s=None, ttft_s=None, tpot_s=None, e2e_s=None, finish_s=None),
        rr(3, ttft_s=6.0, tpot_s=0.2, prefix_hit_tokens=0, output_tokens=9),  # misses both
    ]
    stats = [ReplicaStats("op", "aggregated", 0, 2, 360.0, 360.0, 0, 0, 0)]
    res = ReplayResult(requests, stats, FLEET, start_s=0.0, end_s=1000.0, seed=0, timeline_bin_s=10.0)
    s = summarize(res, SLO(ttft_s=5.0, tpot_s=0.1))
    assert (s.requests, s.completed, s.rejected, s.spilled) == (4, 3, 1, 1)
    assert s.frontier_share == pytest.approx(1 / 3)
    # GPU-hours: 2 GPUs x 1000/3600 h x $3.6 = $2.00.  Energy per GPU: 0.36 kW x 1000/3600 h = 0.1 kWh
    # idle + 0.36 kW x 720/3600 h = 0.072 kWh busy -> 2 x 0.172 kWh x $0.5 = $0.172.
    assert s.onprem_cost_usd == pytest.approx(2.172)
    assert s.frontier_cost_usd == pytest.approx(0.5)
    assert s.output_tokens == 11 + 1 + 9
    assert s.effective_usd_per_mtok == pytest.approx(2.672 / 21 * 1e6)
    assert s.slo_attainment == pytest.approx(2 / 4)
    assert s.goodput_rps == pytest.approx(2 / 1000)
    assert s.prefix_hit_ratio == pytest.approx(40 / 200) and s.restored_ratio == 0.0
    assert s.prefill_utilization == pytest.approx(0.36) and s.decode_utilization == pytest.approx(0.36)
    assert s.utilization == {"op": {"prefill": pytest.approx(0.36), "decode": pytest.approx(0.36)}}
    assert s.ttft_p50_s == pytest.approx(1.0)
    assert s.target_requests == {"op": 2, "fr": 1}
    table = format_table({"x": s})
    assert "x" in table.splitlines()[2] and "127238.10" in table


def test_empty_replay() -> None:
    res = ReplayResult([], [], FLEET, start_s=0.0, end_s=0.0, seed=0, timeline_bin_s=10.0)
    s = summarize(res)
    assert s.requests == 0 and math.isnan(s.ttft_p50_s) and math.isnan(s.effective_usd_per_mtok)
    assert "n/a" in format_table({"empty": s})
