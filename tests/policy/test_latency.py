"""Predicted latency per candidate (policy/selection/latency.py) against hand-computed cases, and
through the real RoutingEngine: a predicted TTFT over the SLO overflows before the queue is
served, P/D by prediction keeps its guards, and the trace carries the inputs."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import Pool, load_fleet
from pointsman.policy.rules.compiler import compile_policy
from pointsman.policy.selection import latency
from pointsman.policy.selection.latency import Prediction
from pointsman.policy.signals.fleet_state import FleetState
from pointsman.request import parse_route_request

NOW = datetime(2025, 3, 14, 12, tzinfo=UTC).timestamp()
HEAD = "apiVersion: pointsman/v1\nkind: RoutingPolicy\n"
POOL = Pool(gpus_per_replica=1, prefill_tokens_per_s=10000, decode_tokens_per_s=1000, decode_step_s=0.02,
            max_num_batched_tokens=1000, kv_cache_capacity_tokens=100000, endpoints=[{"url": "http://x/v1"}])


def test_binomial_quantile_is_exact() -> None:
    # Binomial(4, 1/2): P(<=2) = 11/16 = 0.6875, P(<=3) = 15/16 = 0.9375 -> the 90th percentile is 3
    assert latency.binomial_quantile(4, 0.5, 0.9) == 3
    assert latency.binomial_quantile(4, 0.0, 0.9) == 0 and latency.binomial_quantile(4, 1.0, 0.9) == 4


def test_tpot_floor_batch_share_interference_and_kv_pressure() -> None:
    # step = max(decode_step_s 0.02, (9 + 1) / 1000 = 0.01) = 0.02 s
    assert latency.tpot_s(POOL, 9, 5) == pytest.approx(0.02)
    # batch 49: (49 + 1) / 1000 = 0.05 s, over the floor
    assert latency.tpot_s(POOL, 49, 5) == pytest.approx(0.05)
    # prefill busy half the time: a chunk step lasts chunk_s = 1000 / 10000 = 0.1 s longer;
    # q = 0.5 x 0.02 / (0.5 x 0.1) = 0.2 per step; over m = 5 - 1 = 4 steps, Binomial(4, 0.2):
    # P(0) = 0.4096, P(<=1) = 0.8192, P(<=2) = 0.9728 -> 2 chunked steps: + 2 x 0.1 / 4 = 0.05 s
    assert latency.tpot_s(POOL, 9, 5, prefill_share=0.5) == pytest.approx(0.07)
    # free KV short: vLLM preempts and recomputes -> doubled
    assert latency.tpot_s(POOL, 9, 5, prefill_share=0.5, kv_short=True) == pytest.approx(0.14)
    # one output token has no TPOT interval: no interference
    assert latency.tpot_s(POOL, 9, 1, prefill_share=0.5) == pytest.approx(0.02)


def test_transfer_and_slo_score() -> None:
    # 10,000 tokens x 327,680 B = 3.2768 GB over 84 GB/s = 39.0 ms, + 1.8 ms set-up
    assert latency.transfer_s(10000, 327680, 84e9) == pytest.approx(0.0018 + 3.2768e9 / 84e9)
    assert latency.transfer_s(10000, None, 84e9) == 0.0
    fleet = load_fleet()
    slo = latency.slo_of(fleet, "")  # the fleet's default class: interactive, 2 s / 0.1 s
    assert (slo.ttft_s, slo.tpot_s) == (2.0, 0.1)
    assert latency.slo_of(fleet, "long-context").ttft_s == 6.0
    p = Prediction("t", "aggregated", ttft_s=1.0, tpot_s=0.15)
    assert p.score(slo) == pytest.approx(1.5) and not p.meets(slo)
    q = Prediction("t", "disaggregated", ttft_s=1.8, tpot_s=0.05)
    assert latency.best_mode(p, q, slo) is q and latency.best_mode(p, None, slo) is p


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def fleet():
    return load_fleet()


def engine_for(fleet, text: str) -> tuple[RoutingEngine, Clock]:
    clock = Clock()
    state = FleetState(fleet, None, clock=lambda: NOW, monotonic=clock)
    return RoutingEngine(fleet, compile_policy(HEAD + text, fleet), FixedDifficulty(0.1), state=state), clock


def req(tokens: int, **routing: object):
    return parse_route_request({"messages": [{"role": "user", "content": "hello"}],
                                "routing": {"prompt_tokens": tokens, "explain": True, **routing}})


OVERFLOW = """\
rules:
  - name: onprem-in-slo
    when: predict["onprem-70b"].meets_slo
    route: {target: onprem-70b, mode: aggregated}
  - name: overflow
    when: predict["frontier-small"].ttft_s < predict["onprem-70b"].ttft_s
    route: {target: frontier-small}
  - name: default
    route: {target: onprem-70b, mode: aggregated}
"""


def test_predicted_ttft_over_the_slo_overflows_through_the_engine(fleet) -> None:
    engine, clock = engine_for(fleet, OVERFLOW)
    # idle: TTFT = 6,096 / 12,192 tok/s = 0.5 s; TPOT = the 21 ms step floor (1 / 6,651 is less)
    d = engine.route(req(6096), dispatch=False)
    assert (d.rule, d.target) == ("onprem-in-slo", "onprem-70b")
    p = d.trace["prediction"]["onprem-70b/aggregated"]
    assert p["ttft_s"] == pytest.approx(0.5) and p["queue_s"] == 0.0 and p["tpot_s"] == pytest.approx(0.021)
    assert d.trace["signals"]['predict["onprem-70b"].meets_slo']["value"] is True
    # 20 requests waiting on each aggregated and prefill replica (no prompts known: each counts
    # this one's 6,096 tokens): 20 x 6,096 / 12,192 = 10 s queued + 0.5 s > 2 s in either mode,
    # while frontier-small's default median is 0.6 s -> overflow before the queue is served
    for ep in ("llama-70b-0", "llama-70b-1"):
        engine.state.push_load(ep, {"num_requests_running": 10, "num_requests_waiting": 20}, now=clock.t)
    d = engine.route(req(6096), dispatch=False)
    assert d.rule == "onprem-in-slo"  # the idle P/D pools still meet it: predict[] takes the better mode
    assert d.trace["prediction"]["onprem-70b/disaggregated"]["ttft_s"] < 2.0
    for ep in ("llama-70b-prefill-0", "llama-70b-prefill-1"):
        engine.state.push_load(ep, {"num_requests_running": 0, "num_requests_waiting": 20}, now=clock.t)
    d = engine.route(req(6096), dispatch=False)
    assert (d.rule, d.target) == ("overflow", "frontier-small")
    p = d.trace["prediction"]["onprem-70b/aggregated"]
    assert p["queue_s"] == pytest.approx(10.0) and p["ttft_s"] == pytest.approx(10.5)
    # TPOT: batch 30 -> 31 / 6,651 = 4.7 ms < the 21 ms floor
    assert p["tpot_s"] == pytest.approx(0.021) and p["inputs"]["batch"] == 30
    assert d.trace["prediction"]["frontier-small/aggregated"]["ttft_s"] == pytest.approx(0.6)
    # a shorter queue is not over the SLO when nothing decodes there
    for ep in ("llama-70b-0", "llama-70b-1"):
        engine.state.push_load(ep, {"num_requests_running": 0, "num_requests_waiting": 2}, now=clock.t)
    d = engine.route(req(6096), dispatch=False)
    assert d.rule == "onprem-in-slo"  # 2 x 0.5 + 0.5 = 1.5 s <= 2 s
    # with 10 answers decoding there, those 1.5 s of prefill stall them past the TPOT objective:
    # 21 ms + 1.5 s / 6 steps = 0.271 s > 0.1 s, so the placement misses the SLO (meets_slo false)
    for ep in ("llama-70b-0", "llama-70b-1"):
        engine.state.push_load(ep, {"num_requests_running": 10, "num_requests_waiting": 2}, now=clock.t)
    d = engine.route(req(6096), dispatch=False)
    assert d.rule == "overflow"
    assert d.trace["prediction"]["onprem-70b/aggregated"]["batch_tpot_s"] == pytest.approx(0.021 + 1.5 / 6)


AUTO = """\
disaggregation: {by_prediction: true}
rules:
  - name: seventy
    when: endpoint.predicted_ttft_s >= 0.0
    route: {target: onprem-70b, mode: auto}
  - name: default
    route: {target: onprem-70b, mode: auto}
"""


def test_pd_by_prediction_keeps_the_guards_and_follows_the_queue(fleet) -> None:
    engine, clock = engine_for(fleet, AUTO)
    # idle, 8,000 cold tokens: aggregated TTFT 8,000 / 12,192 = 0.656 s; disaggregated adds the
    # KV transfer (8,000 x 327,680 B over 2 x 42 GB/s = 31.2 ms + 1.8 ms): aggregated scores better
    d = engine.route(req(8000), dispatch=False)
    assert d.mode == "aggregated" and d.trace["mode"]["reason"].startswith("stay aggregated: predicted SLO score")
    dis = d.trace["prediction"]["onprem-70b/disaggregated"]
    assert dis["transfer_s"] == pytest.approx(0.0018 + 8000 * 327680 / 84e9)
    # the aggregated replicas queue 4 requests each (4 x 0.656 s): disaggregating now scores better
    for ep in ("llama-70b-0", "llama-70b-1"):
        engine.state.push_load(ep, {"num_requests_running": 4, "num_requests_waiting": 4}, now=clock.t)
    d = engine.route(req(8000), dispatch=False)
    assert d.mode == "disaggregated" and d.trace["mode"]["reason"].startswith("disaggregate: predicted SLO score")
    # the 512-token guard still applies: a short prompt stays aggregated whatever the prediction
    d = engine.route(req(400), dispatch=False)
    assert d.mode == "aggregated" and "min_uncached_prompt_tokens" in d.trace["mode"]["reason"]
    assert d.trace["signals"]["endpoint.predicted_ttft_s [onprem-70b]"]["value"] > 0.0


def test_batch_tpot_spreads_the_queued_and_own_prefill_over_a_short_answer() -> None:
    # nothing running on the endpoint: no one to stall
    assert latency.batch_tpot_s(POOL, 0, 0, 0.5) == 0.0
    assert latency.batch_tpot_s(POOL, 3, None, 0.5) == 0.0
    # 3 running: step = max(0.02, 3 / 1000 = 0.003) = 0.02 s; 0.3 s of prefill over 6 steps = 0.05 s
    assert latency.STALL_STEPS == 6
    assert latency.batch_tpot_s(POOL, 3, 3, 0.3) == pytest.approx(0.02 + 0.3 / 6)
    # a batch of 49: (49 / 1000 = 0.049 s) over the floor, + 0.06 / 6
    assert latency.batch_tpot_s(POOL, 49, 40, 0.06) == pytest.approx(0.049 + 0.01)
    # the SLO score counts the batch's TPOT: 0.07 / 0.1 = 0.7 > 0.5 / 2 and 0.03 / 0.1
    slo = latency.slo_of(load_fleet(), "")
    p = Prediction("t", "aggregated", ttft_s=0.5, tpot_s=0.03, batch_tpot_s=0.07)
    assert p.score(slo) == pytest.approx(0.7) and p.meets(slo)
    assert not Prediction("t", "aggregated", ttft_s=0.5, tpot_s=0.03, batch_tpot_s=0.11).meets(slo)


STALL = """\
rules:
  - name: seventy
    when: predict["onprem-70b"].aggregated_batch_tpot_s <= 0.05
    route: {target: onprem-70b, mode: aggregated}
  - name: small
    route: {target: onprem-8b}
"""


def test_a_long_prompt_beside_running_answers_is_predicted_to_stall_them(fleet) -> None:
    engine, clock = engine_for(fleet, STALL)
    # idle: nothing decodes on the aggregated replicas, no stall to predict
    d = engine.route(req(6096), dispatch=False)
    assert d.rule == "seventy" and d.trace["prediction"]["onprem-70b/aggregated"]["batch_tpot_s"] == 0.0
    # 4 running on each aggregated replica, nothing queued: the 6,096-token prefill (0.5 s at
    # 12,192 tok/s) joins their steps: 21 ms step + 0.5 s / 6 = 0.104 s > 0.05 -> the 8B model
    for ep in ("llama-70b-0", "llama-70b-1"):
        engine.state.push_load(ep, {"num_requests_running": 4, "num_requests_waiting": 0}, now=clock.t)
    d = engine.route(req(6096), dispatch=False)
    p = d.trace["prediction"]["onprem-70b/aggregated"]
    assert d.rule == "small" and p["batch_tpot_s"] == pytest.approx(0.021 + 0.5 / 6)
    assert p["inputs"]["running"] == 4
    # a 609-token prompt stalls them 0.05 s / 6: 0.0293 s <= 0.05 -> stays on the 70B model
    d = engine.route(req(609), dispatch=False)
    assert d.rule == "seventy"
    assert d.trace["prediction"]["onprem-70b/aggregated"]["batch_tpot_s"] == pytest.approx(0.021 + 609 / 12192 / 6)


def test_a_small_step_budget_caps_the_stall_at_one_chunk(tmp_path) -> None:
    # POOL: step 0.02 s, chunk_s = 1,000 / 10,000 = 0.1 s: 0.3 s of prefill spread over 6 steps
    # (0.05 s each) is under one chunk's 0.08 s beyond the step; 3 s of it is not
    assert latency.batch_tpot_s(POOL, 3, 3, 0.3) == pytest.approx(0.02 + 0.05)
    assert latency.batch_tpot_s(POOL, 3, 3, 3.0) == pytest.approx(0.1)
    # a budget whose chunk is shorter than a decode step adds nothing: the chunk rides the step
    tiny = POOL.model_copy(update={"max_num_batched_tokens": 100})
    assert latency.batch_tpot_s(tiny, 3, 3, 3.0) == pytest.approx(0.02)
    # through the engine: the packaged fleet with the aggregated 70B pool at vLLM's
    # --max-num-batched-tokens 512 (chunk_s = 512 / 12,192 = 42 ms): the 6,096-token prompt that
    # stalls 4 running answers to 0.104 s at 8,192 (the test above) stalls them 42 ms at most
    head, _, tail = Path(load_fleet().file).read_text(encoding="utf-8").partition("  onprem-70b:\n")
    text = head + "  onprem-70b:\n" + tail.replace("max_num_batched_tokens: 8192", "max_num_batched_tokens: 512", 1)
    (tmp_path / "fleet.yaml").write_text(text, encoding="utf-8")
    engine, clock = engine_for(load_fleet(tmp_path / "fleet.yaml"), STALL)
    for ep in ("llama-70b-0", "llama-70b-1"):
        engine.state.push_load(ep, {"num_requests_running": 4, "num_requests_waiting": 0}, now=clock.t)
    d = engine.route(req(6096), dispatch=False)
    assert d.rule == "seventy"
    assert d.trace["prediction"]["onprem-70b/aggregated"]["batch_tpot_s"] == pytest.approx(512 / 12192)


PREFER = AUTO.replace("by_prediction: true", "by_prediction: true, prefer_disaggregated: true")


def test_prefer_disaggregated_takes_the_pd_pool_while_it_meets_the_slo(fleet) -> None:
    engine, clock = engine_for(fleet, PREFER)
    # idle, 8,000 cold tokens: aggregated scores better (no transfer), but the P/D pool meets the
    # SLO (0.656 s + 33 ms of transfer; 21 ms TPOT) -> disaggregated
    d = engine.route(req(8000), dispatch=False)
    assert d.mode == "disaggregated" and "prefer_disaggregated" in d.trace["mode"]["reason"]
    # the prefill pool queues 3 requests (of this one's size) on each replica: 3 x 0.656 = 1.97 s
    # (under the 2 s saturation guard) + 0.656 + 0.033 = 2.66 s > 2 s -> it misses the SLO; the
    # idle aggregated pool scores better
    for ep in ("llama-70b-prefill-0", "llama-70b-prefill-1"):
        engine.state.push_load(ep, {"num_requests_running": 0, "num_requests_waiting": 3}, now=clock.t)
    d = engine.route(req(8000), dispatch=False)
    assert d.mode == "aggregated" and d.trace["mode"]["reason"].startswith("stay aggregated: predicted SLO score")


SHORT = """\
disaggregation: {short_prompts_on_decode: true}
rules:
  - name: seventy
    route: {target: onprem-70b, mode: auto}
"""


def test_short_prompts_on_decode_spreads_short_prompts_over_the_decode_pool(fleet) -> None:
    engine, clock = engine_for(fleet, SHORT)
    off, _ = engine_for(fleet, AUTO)
    # the aggregated replicas each run 8 and queue 2 short prompts (400 tokens each: 0.066 s of
    # queued prefill), the decode replicas are idle
    for e in (engine, off):
        for ep in ("llama-70b-0", "llama-70b-1"):
            e.state.push_load(ep, {"num_requests_running": 8, "num_requests_waiting": 2}, now=clock.t)
    # a 400-token prompt stays aggregated (the 512-token guard); with the option it may prefill
    # on a decode endpoint, whose cost is lower (no queue, batch 0), and it runs there
    d = engine.route(req(400), dispatch=False)
    assert d.mode == "aggregated" and d.endpoints[0].name.startswith("llama-70b-decode-")
    # without it: an aggregated endpoint
    d = off.route(req(400), dispatch=False)
    assert d.mode == "aggregated" and d.endpoints[0].name in ("llama-70b-0", "llama-70b-1")
    # a 600-token prompt is not short: it disaggregates (rules of thumb), never prefills on a decode endpoint
    d = engine.route(req(600), dispatch=False)
    assert d.mode == "disaggregated" and d.endpoints[0].role == "prefill"
