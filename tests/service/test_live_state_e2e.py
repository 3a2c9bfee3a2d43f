"""Two ``pointsman serve`` replicas sharing one real Redis, with a stand-in engine per endpoint
speaking the real protocols (Prometheus /metrics pages, vLLM's ZMQ KV events): telemetry pushed
to one is read by decisions on the other; an outcome on either releases the load a decision on
the other reserved; engine-reported prefix blocks steer both, and their eviction steers neither;
a scrape reporting a long queue changes both; a stopped engine is unhealthy within two scrape
intervals."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

import httpx
import pytest

from pointsman.estimator.model_source import bundled_model_dir
from pointsman.outcome_log.store import OutcomeLog
from pointsman.policy.signals.engine_hashes import TargetTokenizer

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\\n{{ m['content'] }}\\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\\n{% endif %}")
LONG = ("Summarise the following incident report for the on-call engineer, listing the affected services, "
        "the timeline and the open questions. ") + " ".join(f"step {i}: the cache warmed and the queue drained." for i in range(90))
INTERVAL_S = 0.5


def eventually(check, timeout_s=15.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def fleet_yaml(engines, tokenizer: Path, template: Path) -> str:
    eps = "\n".join(
        f"""          - name: e{i}
            url: "{e.base_url}/v1"
            metrics_url: "{e.metrics_url}"
            kv_events: {{url: "{e.kv_events_url}", replay_url: "{e.replay_url}"}}""" for i, e in enumerate(engines))
    return f"""apiVersion: pointsman/v1
kind: Fleet
defaults: {{output_tokens: 64, scrape_metrics: true}}
targets:
  onprem-8b:
    kind: onprem
    model: meta-llama/Llama-3.1-8B-Instruct
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
    kv_events: {{tokenizer: "{tokenizer}", chat_template: "{template}", hash_algo: sha256}}
    pools:
      aggregated:
        gpus_per_replica: 1
        prefill_tokens_per_s: 20000
        decode_tokens_per_s: 20000
        endpoints:
{eps}
  frontier-small:
    kind: frontier
    provider: openai
    model: gpt-4o-mini
    base_url: https://api.openai.com/v1
    context_window_tokens: 128000
    prices: {{usd_per_1m_input_tokens: 0.15, usd_per_1m_cached_input_tokens: 0.075, usd_per_1m_output_tokens: 0.6}}
"""


POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: busy
    when: load["onprem-8b"].num_requests_waiting > 30
    route: {target: frontier-small}
  - name: hot
    when: load["onprem-8b"].prefill_utilization > 0.5
    route: {target: onprem-8b}
  - name: default
    route: {target: onprem-8b}
"""


def write_files(tmp_path, engines) -> tuple[Path, Path]:
    """The tokenizer, chat template, fleet (``engines`` as the one target's endpoints) and policy files in
    ``tmp_path``; returns (tokenizer, template)."""
    tokenizer = tmp_path / "tokenizer.json"
    shutil.copyfile(bundled_model_dir() / "tokenizer.json", tokenizer)
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    (tmp_path / "fleet.yaml").write_text(fleet_yaml(engines, tokenizer, template))
    (tmp_path / "policy.yaml").write_text(POLICY)
    return tokenizer, template


@pytest.fixture
def setup(tmp_path, serve, redis_url, standin):
    engines = [standin.StandinEngine("vllm").start() for _ in range(2)]
    tokenizer, template = write_files(tmp_path, engines)
    settings = dict(fleet_path=tmp_path / "fleet.yaml", policy_path=tmp_path / "policy.yaml", watch_policy="false",
                    watch_fleet="false", scrape_interval_s=INTERVAL_S, scrape_timeout_s=0.3,
                    scrape_failures_to_unhealthy=2,
                    state_url=f"{redis_url}?prefix=%7Be2e-{uuid.uuid4().hex[:8]}%7D:")
    a = serve(tmp_path / "a", **settings)[1]
    b = serve(tmp_path / "b", **settings)[1]
    tok = TargetTokenizer.from_files(tokenizer, chat_template_file=template)
    yield engines, a, b, tok, tmp_path / "a" / "outcomes.db"
    for e in engines:
        e.stop()


def route(base, content=LONG, explain=False):
    body = {"messages": [{"role": "user", "content": content}], "routing": {"explain": explain}}
    return httpx.post(f"{base}/v1/route", json=body, timeout=10).json()


def done(base, decision):
    r = httpx.post(f"{base}/v1/outcomes", json={"decision_id": decision["decision_id"],
                                                "usage": {"prompt_tokens": 100, "completion_tokens": 5}}, timeout=10)
    return r.json()["acks"][0]


def inflight(base):
    fleet = httpx.get(f"{base}/v1/fleet", timeout=10).json()
    return sum(ep["load"]["inflight_requests"] for ep in fleet["targets"]["onprem-8b"]["endpoints"] if ep["load"])


def test_two_replicas_share_live_state(setup):
    engines, a, b, tok, log_a = setup
    e0, e1 = (f"{e.base_url}/v1" for e in engines)
    # both scrape both engines: the fleet knows them
    assert eventually(lambda: all(ep["scrape"] and ep["scrape"]["age_s"] is not None
                                  for ep in httpx.get(f"{b}/v1/fleet").json()["targets"]["onprem-8b"]["endpoints"]))

    # 1. telemetry pushed to A is read by a decision on B
    r = httpx.post(f"{a}/v1/telemetry", json={"endpoint": "e0", "load": {"prefill_utilization": 0.9}}, timeout=10)
    assert r.status_code == 200
    assert eventually(lambda: (d := route(b))["rule"] == "hot" and done(b, d))

    # 2. a decision on A and its outcome posted to B leave the in-flight count where it started
    assert eventually(lambda: inflight(a) == 0 and inflight(b) == 0)
    d = route(a)
    assert eventually(lambda: inflight(b) == 1)
    ack = done(b, d)
    assert ack["status"] == "forwarded" and ack["settlement"]["released_load"] >= 1
    assert eventually(lambda: inflight(a) == 0 and inflight(b) == 0)
    # ... and the outcome lands in A's outcome log, next to its decision; a retry to B stays idempotent
    with OutcomeLog(log_a) as logged:
        assert eventually(lambda: logged.outcome(d["decision_id"]) is not None)
    assert done(b, d)["settlement"]["replayed"] is True

    # 3. engine-reported blocks steer both replicas; their eviction steers neither
    ids = tok.prompt_token_ids([{"role": "user", "content": LONG}])
    _, stored = engines[1].prefill(ids)
    assert stored is not None and len(stored.block_hashes) >= 10

    def routed_to(base, url):
        decision = route(base, explain=True)
        done(base, decision)
        return decision["endpoints"][0]["url"] == url and \
            decision["trace"]["cache_sources"].get("onprem-8b") == "engine events"

    assert eventually(lambda: routed_to(a, e1) and routed_to(b, e1))
    engines[1].evict(stored.block_hashes)
    assert eventually(lambda: routed_to(a, e0) and routed_to(b, e0))

    # 4. a scrape that reports 40 waiting changes load[...] on both
    engines[1].metrics.set(waiting=40)
    assert eventually(lambda: route(a)["rule"] == "busy" and route(b)["rule"] == "busy")
    engines[1].metrics.set(waiting=0)
    assert eventually(lambda: route(a)["rule"] != "busy" and route(b)["rule"] != "busy")

    # 5. stopping an engine marks its endpoint unhealthy within two scrape intervals
    engines[0].stop()  # the service marks it after scrape_failures_to_unhealthy=2 failed scrapes: two intervals

    def unhealthy_on_both():
        return all(not ep["healthy"] for base in (a, b)
                   for ep in httpx.get(f"{base}/v1/fleet").json()["targets"]["onprem-8b"]["endpoints"]
                   if ep["url"] == e0)

    assert eventually(unhealthy_on_both, timeout_s=10)
    decision = route(a)
    assert decision["endpoints"][0]["url"] == e1


def test_a_batch_whose_type_tag_is_no_string_drops_the_endpoints_blocks_and_the_stream_goes_on(tmp_path, serve, standin):
    """A payload whose event's type tag is an array or a map (msgpack decodes them unhashable) is an
    undecodable batch like any other: the endpoint's reported blocks are dropped (a missed BlockRemoved
    could hide in it) and the next batches are applied. Before: the decoder raised TypeError ('unhashable
    type'), which ended the endpoint's subscriber thread: its blocks stayed claimed, and no later
    eviction or store of that engine reached the index."""
    import msgpack

    engines = [standin.StandinEngine("vllm").start() for _ in range(2)]
    tokenizer, template = write_files(tmp_path, engines)
    try:
        _, base = serve(tmp_path / "data", fleet_path=tmp_path / "fleet.yaml", policy_path=tmp_path / "policy.yaml",
                        watch_policy="false", watch_fleet="false", scrape_interval_s=INTERVAL_S, scrape_timeout_s=0.3)
        tok = TargetTokenizer.from_files(tokenizer, chat_template_file=template)
        e0, e1 = (f"{e.base_url}/v1" for e in engines)

        def routed_to(url):
            decision = route(base, explain=True)
            done(base, decision)
            return decision["endpoints"][0]["url"] == url

        ids = tok.prompt_token_ids([{"role": "user", "content": LONG}])
        _, stored = engines[1].prefill(ids)
        assert stored is not None and eventually(lambda: routed_to(e1))
        for tag in (["BlockStored"], {"type": "BlockRemoved"}):
            engines[1].events.publish_payload(msgpack.packb([1.0, [[tag, [1], None, [], 16]]]))
        assert eventually(lambda: routed_to(e0))  # before: e1, its blocks still claimed
        engines[1].evict(stored.block_hashes)
        engines[1].prefill(ids)  # the engine caches the prompt again: the stream goes on
        assert eventually(lambda: routed_to(e1))
    finally:
        for e in engines:
            e.stop()
