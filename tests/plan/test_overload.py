"""A shape whose on-prem pool cannot keep up with the traffic (its work over the arrival span exceeds
its GPU time there) is overloaded: it does not meet the goal whatever SLO attainment a short trace
gives it, and no shape's month bills more busy power than its GPUs can draw. Real replays of the
small test fleet (``conftest.FLEET``: one 8B target, prefill + decode pools)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pointsman.datasets.traces import load_trace
from pointsman.estimator.estimate import FixedDifficulty
from pointsman.plan.evaluate import PlanInputs, ShapeResult, evaluate
from pointsman.plan.front import pareto_front, recommend
from pointsman.plan.prices import HOURS_PER_MONTH
from pointsman.plan.search import meets_up_to, validation_candidates
from pointsman.plan.shapes import Pools, ShapeSpace
from pointsman.policy.fleet import load_fleet
from pointsman.replay.fleet_map import sim_fleet
from pointsman.replay.summary import SLO
from tests.plan.conftest import FLEET, POLICY, write_trace


def _inputs(tmp: Path, n: int, rate_rps: float, prompt: int, output: int) -> PlanInputs:
    (tmp / "fleet.yaml").write_text(FLEET, encoding="utf-8")
    (tmp / "policy.yaml").write_text(POLICY, encoding="utf-8")
    fleet = load_fleet(tmp / "fleet.yaml")
    kv = {t.name: t.replica.kv_bytes_per_token for t in sim_fleet(fleet).on_prem}
    space = ShapeSpace.of(yaml.safe_load(FLEET), fleet, kv, max_replicas=2)
    trace = load_trace(write_trace(tmp / "trace.jsonl", n, rate_rps, prompt, output))
    return PlanInputs(trace, None, None, tmp / "policy.yaml", SLO(2.0, 0.1), "interactive", space)


def _eval(inputs: PlanInputs, pools: Pools) -> ShapeResult:
    return evaluate(inputs, FixedDifficulty(0.2), inputs.space.base.with_pools("small", pools))


def test_a_pool_that_cannot_keep_up_does_not_meet_the_goal(tmp_path: Path) -> None:
    """60 distinct 6,144-token prompts at 10/s for 5.9 s: one prefill replica needs about 0.12 s of
    compute for each, 122% of its time while they arrive, so its queue grows by 0.2 s a second. The
    trace ends before that queue costs a TTFT: 1 prefill + 1 decode replica met 100% of the SLO and
    was recommended over 2 prefill replicas (the same rate over 100 requests: 85%). Now it is
    overloaded: not recommended, not a validation candidate, meets no growth scale, and it does not
    dominate the shape that keeps up."""
    inputs = _inputs(tmp_path, 60, 10.0, 6144, 32)
    one, two = _eval(inputs, Pools(0, 1, 1, 0)), _eval(inputs, Pools(0, 2, 1, 0))
    span = inputs.trace[-1].arrival_s - inputs.trace[0].arrival_s
    # the latency model's compute for the 60 prompts (one chunk each, no cached prefix) over the span
    spec = sim_fleet(load_fleet(tmp_path / "fleet.yaml")).on_prem[0].spec_for("prefill")
    need = 60 * spec.work_s(0, 0, 6144, 6144 * 6145 / 2) / span
    assert one.load["small/prefill"] == pytest.approx(need, rel=1e-6) and need > 1.15
    assert two.load["small/prefill"] == pytest.approx(need / 2, rel=1e-6)
    assert one.slo_attainment == 1.0 and one.usd_per_month < two.usd_per_month  # what made it the answer
    assert one.overloaded and not one.meets(0.9) and one.peak_load == ("small/prefill", one.load["small/prefill"])
    assert two.meets(0.9)
    assert recommend([one, two], 0.9) is two
    assert validation_candidates([one, two], 0.9, 3) == [two]
    assert meets_up_to(one.shape, [one], [1.0], 0.9) == 0.0
    assert two in pareto_front([one, two])


@settings(max_examples=12, deadline=None)
@given(n=st.integers(2, 12), rate=st.sampled_from([0.5, 2.0, 10.0, 40.0]), blocks=st.integers(1, 12),
       output=st.sampled_from([1, 32, 500, 2000]))
@example(n=10, rate=1.0, blocks=2, output=2000)  # the docstring's case
def test_a_month_bills_no_more_busy_power_than_the_gpus_can_draw(tmp_path_factory: pytest.TempPathFactory, n: int,
                                                                 rate: float, blocks: int, output: int) -> None:
    """Busy power is billed by the arrival span (a month of the trace's traffic); a replica busy
    longer than that span (answers decoding after the last arrival, or an overloaded pool) billed
    more busy hours than a month holds: one aggregated replica serving 10 requests at 1/s with
    2,000-token answers is busy 16.6 s per 9 s of traffic, and its month billed 184% of the busy
    power one GPU can draw in a month. On-prem cost is GPU rent and idle power all month plus
    busy power at most all month."""
    tmp = tmp_path_factory.mktemp("t")
    inputs = _inputs(tmp, n, rate, 512 * blocks, output)
    (tmp / "policy.yaml").write_text(POLICY.replace("mode: disaggregated}", "mode: aggregated}"), encoding="utf-8")
    r = _eval(inputs, Pools(1, 0, 0, 0))
    assert r.ok, r.error
    target = sim_fleet(load_fleet(tmp / "fleet.yaml")).on_prem[0]
    spec = target.spec_for("aggregated")
    rent_and_idle = r.gpus * HOURS_PER_MONTH * (target.gpu_hour_usd + spec.gpu_idle_kw * target.electricity_usd_per_kwh)
    busy_max = r.gpus * HOURS_PER_MONTH * (spec.gpu_tdp_kw - spec.gpu_idle_kw) * target.electricity_usd_per_kwh
    assert r.onprem_usd_per_month - rent_and_idle <= busy_max * (1 + 1e-9)
