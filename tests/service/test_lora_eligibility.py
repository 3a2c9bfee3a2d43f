"""A request whose ``model`` names a LoRA adapter goes only to targets serving it, through a real ``pointsman serve``.

vLLM's OpenAI server selects an adapter by the request's ``model`` (``--lora-modules name=path``); a fleet target lists
the adapters its engines serve (``lora_adapters``). Anywhere else the request would be forwarded with that target's own
``model``: the base model or a frontier tier answers, and the task-specific fine-tune the client asked for is dropped
without a word. Before, such targets stayed eligible: a ``sql-lora`` request was sent to ``onprem-8b`` (its rule's
target) as ``meta-llama/Llama-3.1-8B-Instruct``, with ``frontier-small`` (``gpt-4o-mini``) among its fallbacks; a
rule naming only such targets routed it there rather than refusing it. Now the ``capabilities`` filter removes them,
named in the trace and in the 422 as the other capability filters are. A ``model`` that is no adapter of the fleet
routes as before."""

from __future__ import annotations

import httpx

from tests.service.conftest import endpoint_yaml, route, serve_fleet

BASE = "meta-llama/Llama-3.1-8B-Instruct"
ONPREM = """
  {name}:
    kind: onprem
    model: meta-llama/Llama-3.1-8B-Instruct
    lora_adapters: {adapters}
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
    pools:
      aggregated:
        gpus_per_replica: 1
        prefill_tokens_per_s: 20000
        decode_tokens_per_s: 20000
        endpoints:
{endpoint}"""
FLEET = """apiVersion: pointsman/v1
kind: Fleet
defaults: {{output_tokens: 64, scrape_metrics: false}}
targets:{onprem}
  frontier-small:
    kind: frontier
    provider: openai
    model: gpt-4o-mini
    base_url: https://api.openai.com/v1
    context_window_tokens: 128000
    prices: {{usd_per_1m_input_tokens: 0.15, usd_per_1m_cached_input_tokens: 0.075, usd_per_1m_output_tokens: 0.6}}
""".format(onprem="".join(ONPREM.format(name=n, adapters=a, endpoint=endpoint_yaml(f"{n}-0")) for n, a in (
    ("onprem-8b", "[]"), ("onprem-sql", "[sql-lora]"), ("onprem-both", "[sql-lora, chat-lora]"))))
POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: api
    when: request.tenant == "api"
    route: {target: frontier-small}
  - name: open
    when: request.tenant != "pinned"
    route: {target: onprem-8b, fallbacks: [frontier-small, onprem-sql, onprem-both]}
  - name: pinned
    route: {target: onprem-8b, fallbacks: [frontier-small]}
"""
NOT_SERVED = "capabilities: does not serve the LoRA adapter '{}' the request's model names (fleet: lora_adapters)"


def test_a_lora_request_goes_only_to_targets_serving_its_adapter(tmp_path, serve):
    base, _ = serve_fleet(tmp_path, serve, FLEET, POLICY)

    def decide(model: str | None, tenant: str | None = None) -> dict:
        body = {"messages": [{"role": "user", "content": "Write the SQL for the monthly orders report."}],
                "routing": {"explain": True, **({"tenant": tenant} if tenant else {})},
                **({"model": model} if model else {})}
        return route(base, body)

    def chain(d: dict) -> list[tuple[str, str]]:
        return [(d["target"], d["model"])] + [(f["target"], f["model"]) for f in d["fallbacks"]]

    def excluded(d: dict) -> dict[str, str | None]:
        return {c["target"]: c["excluded_by"] for c in d["trace"]["candidates"]}

    d = decide("sql-lora")
    assert chain(d) == [("onprem-sql", "sql-lora"), ("onprem-both", "sql-lora")], chain(d)
    assert excluded(d) == {"onprem-8b": NOT_SERVED.format("sql-lora"), "frontier-small": NOT_SERVED.format("sql-lora"),
                           "onprem-sql": None, "onprem-both": None}
    d = decide("chat-lora")
    assert chain(d) == [("onprem-both", "chat-lora")], chain(d)
    assert excluded(d)["onprem-sql"] == NOT_SERVED.format("chat-lora")

    # a model that is no adapter of the fleet: the router's to map, as before
    everything = [("onprem-8b", BASE), ("frontier-small", "gpt-4o-mini"), ("onprem-sql", BASE), ("onprem-both", BASE)]
    for model in (None, "auto", "gpt-4o", BASE, "other-lora"):
        d = decide(model)
        assert chain(d) == everything and not any(excluded(d).values()), (model, chain(d))
    assert chain(decide("auto", tenant="pinned")) == everything[:2]
    assert chain(decide("auto", tenant="api")) == everything[1:2]

    # a rule naming no target that serves it passes the request on, as for any filter; with none left it is refused,
    # saying why
    d = decide("sql-lora", tenant="api")
    assert chain(d)[0] == ("onprem-sql", "sql-lora") and d["rule"] == "open", d["rule"]
    r = httpx.post(f"{base}/v1/route", timeout=10, json={
        "model": "sql-lora", "messages": [{"role": "user", "content": "Monthly orders report."}],
        "routing": {"tenant": "pinned"}})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "no_eligible_target", error
    assert error["message"] == (f"no eligible target: onprem-8b ({NOT_SERVED.format('sql-lora')}); "
                                f"frontier-small ({NOT_SERVED.format('sql-lora')})"), error
