"""Property (hypothesis): on a target without engine events, Pointsman's estimate of what a replica holds keeps
vLLM's cache namespaces apart. A prompt dispatched under a namespace (its ``cache_salt``, and the LoRA adapter its
``model`` names on the target) is read as held on the replica it went to by a later request for the same prompt in
that namespace only: under any other salt or adapter every replica reads 0 hit tokens, as vLLM, whose block hashes
carry both, would reuse none of it. For the rendered text's hashes and for the gateway's ``prefix_block_hashes``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import parse_fleet
from pointsman.policy.rules.compiler import compile_policy
from pointsman.policy.signals.fleet_state import FleetState
from pointsman.request import parse_route_request

FLEET = parse_fleet("""apiVersion: pointsman/v1
kind: Fleet
defaults: {output_tokens: 64, scrape_metrics: false}
targets:
  onprem-8b:
    kind: onprem
    model: meta-llama/Llama-3.1-8B-Instruct
    lora_adapters: [sql-lora, chat-lora]
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
    pools:
      aggregated:
        gpus_per_replica: 1
        prefill_tokens_per_s: 20000
        decode_tokens_per_s: 20000
        endpoints:
          - {name: a, url: "http://a.internal:8000/v1"}
          - {name: b, url: "http://b.internal:8000/v1"}
          - {name: c, url: "http://c.internal:8000/v1"}
""")
POLICY = compile_policy("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n  - name: d\n    route: {target: onprem-8b}\n",
                        FLEET)
PROMPT = " ".join(f"clause {i} of the contract binds both parties." for i in range(120))
SALTS = st.one_of(st.none(), st.sampled_from(["", "tenant-a", "tenant-b", "tenant-a "]), st.text(max_size=6))
# the base model (no model, the target's own, one it does not serve) or one of its adapters
MODELS = st.sampled_from([None, "meta-llama/Llama-3.1-8B-Instruct", "other-lora", "sql-lora", "chat-lora"])


def body(salt: str | None, model: str | None, gateway_ids: bool, explain: bool = False) -> dict:
    routing: dict = {"explain": explain}
    if gateway_ids:
        routing["prefix_block_hashes"] = [f"block-{i}" for i in range(8)]
    return {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 64, "routing": routing,
            **({"cache_salt": salt} if salt is not None else {}), **({"model": model} if model is not None else {})}


def namespace(salt: str | None, model: str | None) -> tuple[str, str | None]:
    """vLLM's: an empty salt is none; a model that is none of the target's adapters is the base model."""
    return salt or "", model if model in ("sql-lora", "chat-lora") else None


@settings(max_examples=60, deadline=None)
@given(recorded=st.tuples(SALTS, MODELS), looked_up=st.tuples(SALTS, MODELS), gateway_ids=st.booleans())
def test_a_prefix_is_held_only_in_the_namespace_it_was_dispatched_in(recorded, looked_up, gateway_ids):
    engine = RoutingEngine(FLEET, POLICY, FixedDifficulty(0.1), state=FleetState(FLEET))
    first = engine.route(parse_route_request(body(*recorded, gateway_ids)))
    d = engine.route(parse_route_request(body(*looked_up, gateway_ids, explain=True)), dispatch=False)
    hits = {c["endpoint"]: c["local_hit_tokens"] for c in d.trace["endpoints"][0]["candidates"]}
    if namespace(*recorded) == namespace(*looked_up):
        assert hits[first.endpoints[0].name] > 0 and sum(hits.values()) == hits[first.endpoints[0].name], hits
    else:
        assert hits == {"a": 0, "b": 0, "c": 0}, (recorded, looked_up, hits)
