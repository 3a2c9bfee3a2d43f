"""An on-prem vision target's load and P/D choices count a request's images, through ``POST /v1/route`` on the app
with a fleet file whose ``onprem-vl`` takes images (``image_tokens: {high: 3000, low: 500}``) at 10,000 prefill
tokens/s. The cost counted them (``cost.target_prompt_tokens``) but the request's own predicted prefill, the P/D
rule of thumb on the uncached prompt (512 tokens), the dispatch record (the prefill queued on the endpoint, which
the queue scorer and every later prediction read) and the answer's ``prompt_tokens`` counted the text alone. Every
request sends ``routing.prompt_tokens`` (its text's exact count: the images are added to it), so the counts here
are exact. An assistant message's ``audio: {id}`` (earlier audio the provider bills again) counts as an audio
part of unknown size."""

from __future__ import annotations

import yaml
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import load_policy
from pointsman.policy.signals.fleet_state import FleetState
from pointsman.service.app import create_app
from pointsman.service.settings import Settings

HIGH, LOW, PREFILL = 3000, 500, 10_000.0


def _pool(n: int, prefix: str, gpus: int = 2) -> dict:
    return {"gpus_per_replica": gpus, "prefill_tokens_per_s": PREFILL, "decode_tokens_per_s": 50_000.0,
            "endpoints": [{"name": f"{prefix}{i}", "url": f"http://{prefix}{i}.internal:8000/v1"} for i in range(n)]}


FLEET = {"apiVersion": "pointsman/v1", "kind": "Fleet", "defaults": {"output_tokens": 32, "scrape_metrics": False},
         "targets": {"onprem-vl": {"kind": "onprem", "model": "Qwen/Qwen2.5-VL-72B-Instruct",
                                   "context_window_tokens": 131072, "usd_per_gpu_hour": 2.5,
                                   "capabilities": {"images": True, "audio": True},
                                   "image_tokens": {"high": HIGH, "low": LOW},
                                   # 16 GPUs of prefill/decode: past the P/D guard's min_pool_gpus (12)
                                   "pools": {"aggregated": _pool(2, "a"), "prefill": _pool(4, "p"),
                                             "decode": _pool(4, "d")}}}}


def _client(tmp_path, mode: str = "aggregated") -> tuple[TestClient, RoutingEngine]:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(FLEET))
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump({
        "apiVersion": "pointsman/v1", "kind": "RoutingPolicy",
        "rules": [{"name": "predicted", "when": 'predict["onprem-vl"].ttft_s >= 0.0',  # reads the prediction
                   "route": {"target": "onprem-vl", "mode": mode}},
                  {"name": "default", "route": {"target": "onprem-vl", "mode": mode}}]}))
    fleet = load_fleet(tmp_path / "fleet.yaml")
    s = Settings(data_dir=tmp_path / "data", fleet_path=tmp_path / "fleet.yaml", policy_path=tmp_path / "policy.yaml",
                 watch_policy=False, watch_fleet=False, scrape_interval_s=0)
    engine = RoutingEngine(fleet, load_policy(tmp_path / "policy.yaml", fleet), FixedDifficulty(0.2),
                           state=FleetState(fleet))
    return TestClient(create_app(s, engine=engine, owns_engine=True)), engine


def _body(text: str, tokens: int, images: tuple[str | None, ...] = ()) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": f"https://example.com/{k}.png",
                                                 **({"detail": d} if d else {})}} for k, d in enumerate(images)]
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}], "max_tokens": 64,
            "routing": {"prompt_tokens": tokens, "explain": True}}


def _route(c: TestClient, body: dict) -> dict:
    r = c.post("/v1/route", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _candidates(d: dict, role: str) -> dict[str, dict]:
    pick = next(p for p in d["trace"]["endpoints"] if p["role"] == role)
    return {x["endpoint"]: x for x in pick["candidates"]}


def test_an_image_is_prefill_work_its_queue_and_its_count(tmp_path):
    """300 text tokens and an image (3,000 on onprem-vl): the answer counts 3,300, the prediction's prefill is
    3,300 tokens' (0.33 s, was 0.03), and the next request reads them queued on that endpoint."""
    c, _ = _client(tmp_path)
    with c:
        d = _route(c, _body("What does this scan say?", 300, (None,)))
        assert d["trace"]["prediction"]["onprem-vl/aggregated"]["prefill_s"] == (300 + HIGH) / PREFILL
        assert d["trace"]["signals"]['predict["onprem-vl"].ttft_s']["value"] == (300 + HIGH) / PREFILL
        first = d["endpoints"][0]["name"]
        queued = _candidates(_route(c, _body("And the weather?", 20)), "aggregated")[first]["queue"]
        assert queued == (300 + HIGH) / PREFILL
        assert d["prompt_tokens"] == 300 + HIGH


def test_an_images_tokens_pass_the_pd_threshold(tmp_path):
    """300 text tokens are under ``min_uncached_prompt_tokens`` (512) and stay aggregated; with an image there
    the uncached prompt is 3,300 tokens: disaggregated."""
    c, _ = _client(tmp_path, "auto")
    with c:
        assert _route(c, _body("What is the capital of France?", 300))["mode"] == "aggregated"
        d = _route(c, _body("What does this scan say?", 300, (None,)))
        assert d["mode"] == "disaggregated", d["trace"]["mode"]
        assert d["trace"]["mode"]["inputs"]["uncached_prompt_tokens"] == 300 + HIGH


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(50, 2000), st.lists(st.sampled_from([None, "low", "high"]), max_size=3),
                          st.sampled_from(["aggregated", "disaggregated"])), min_size=1, max_size=6))
def test_queued_prefill_counts_every_image_and_is_released(tmp_path_factory, requests):
    """Whatever the requests (text count, images and their detail, mode), the prefill tokens in flight on
    onprem-vl's endpoints are the sum of the answers' ``prompt_tokens`` (text + 3,000 an image, 500 at low
    detail: no prefix is cached, every text is under a block), and 0 once every outcome is in."""
    tmp = tmp_path_factory.mktemp("load")
    answers = []
    for mode in ("aggregated", "disaggregated"):
        c, engine = _client(tmp / mode, mode)
        with c:
            mine = [(tokens, images) for tokens, images, m in requests if m == mode]
            for k, (tokens, images) in enumerate(mine):
                d = _route(c, _body(f"Request {k}.", tokens, tuple(images)))
                assert d["prompt_tokens"] == tokens + sum(LOW if i == "low" else HIGH for i in images)
                answers.append(d)
            assert _inflight(engine) == sum(d["prompt_tokens"] for d in answers if d["mode"] == mode)
            for d in answers:
                if d["mode"] == mode:
                    r = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "served_target": "onprem-vl"})
                    assert r.status_code == 200, r.text
            assert _inflight(engine) == 0


def _inflight(engine: RoutingEngine) -> int:
    """Prompt tokens in flight on the fleet's endpoints, by the load board (what the queue scorer reads)."""
    state = engine.state
    board = state.board.get_many(engine.fleet.endpoints, state.monotonic(), engine.policy.staleness)
    return sum(x.inflight_prompt_tokens for x in board.values())


def test_an_assistant_audio_reference_counts_as_audio_of_unknown_size(tmp_path):
    """OpenAI re-bills an earlier answer's audio (``audio: {id}`` on an assistant message) as input: of unknown
    size here, it counts the rest of the window, as an audio part given by reference does."""
    c, _ = _client(tmp_path)
    with c:
        body = _body("And in French?", 40)
        body["messages"][:0] = [{"role": "user", "content": "Say hello."},
                                {"role": "assistant", "audio": {"id": "audio_abc123"}}]
        d = _route(c, body)
        assert d["prompt_tokens"] == 131072 - 64, d["prompt_tokens"]
