"""Property (hypothesis): on an idle fleet fed by engine KV events, a request goes to the replica holding the longest
prefix of it, and reads as cached exactly the blocks that replica reported, in the engine's tokens.

Three aggregated replicas of an event-fed target (the bundled tokenizer, a chat template); each holds the first
``k_i`` blocks of the request's prompt as its engine reports them (``FleetState.store_blocks``, the sink the ZMQ
subscriber feeds, keyed by the stand-in engine's own vLLM hashes), plus a stranger's blocks. The longest holder is
chosen (ties: any of the tied ones), its ``local_hit_tokens`` is ``k x 16 / engine tokens`` of the prompt's tokens,
and a replica holding none of the first block reads 0 whatever it holds after it."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.estimator.model_source import bundled_model_dir
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import compile_policy
from pointsman.policy.signals.engine_hashes import TargetTokenizer
from pointsman.policy.signals.fleet_state import FleetState
from pointsman.policy.signals.kv_events import hash_key
from pointsman.request import parse_route_request

if "standin_engine" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("standin_engine", Path(__file__).parents[1] / "fixtures" / "standin_engine.py")
    assert _spec is not None and _spec.loader is not None
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["standin_engine"] = _module
    _spec.loader.exec_module(_module)
se = sys.modules["standin_engine"]

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
DIR = Path(tempfile.mkdtemp(prefix="prefix-holder-"))
shutil.copyfile(bundled_model_dir() / "tokenizer.json", DIR / "tokenizer.json")
(DIR / "template.jinja").write_text(TEMPLATE)
(DIR / "fleet.yaml").write_text("""apiVersion: pointsman/v1
kind: Fleet
defaults: {output_tokens: 64, scrape_metrics: false}
targets:
  onprem-8b:
    kind: onprem
    model: meta-llama/Llama-3.1-8B-Instruct
    context_window_tokens: 131072
    usd_per_gpu_hour: 2.5
    kv_events: {tokenizer: tokenizer.json, chat_template: template.jinja}
    pools:
      aggregated:
        gpus_per_replica: 1
        prefill_tokens_per_s: 20000
        decode_tokens_per_s: 20000
        endpoints:
          - {name: a, url: "http://a.internal:8000/v1", kv_events: {url: "tcp://127.0.0.1:1"}}
          - {name: b, url: "http://b.internal:8000/v1", kv_events: {url: "tcp://127.0.0.1:2"}}
          - {name: c, url: "http://c.internal:8000/v1", kv_events: {url: "tcp://127.0.0.1:3"}}
""")
FLEET = load_fleet(DIR / "fleet.yaml")
POLICY = compile_policy("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n  - name: d\n    route: {target: onprem-8b}\n",
                        FLEET)
TOKENIZER = TargetTokenizer.from_files(DIR / "tokenizer.json", chat_template_file=DIR / "template.jinja")
IDS = [e.id for e in FLEET.pool_endpoints("onprem-8b", "aggregated")]
NAMES = {e.id: e.name for e in FLEET.pool_endpoints("onprem-8b", "aggregated")}


def keys(token_ids: list[int]) -> list[int]:
    return [hash_key(h) for h in se.StandinKVCache().hashes(token_ids)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=st.integers(40, 400), held=st.lists(st.integers(0, 30), min_size=3, max_size=3),
       tail_only=st.lists(st.booleans(), min_size=3, max_size=3), turn=st.integers(0, 5))
def test_the_longest_holder_is_chosen_and_read_in_engine_blocks(words, held, tail_only, turn):
    messages = [{"role": "user", "content": " ".join(f"w{i}" for i in range(words))}]
    ids = TOKENIZER.prompt_token_ids(messages)
    mine = keys(ids)
    stranger = keys(TOKENIZER.prompt_token_ids([{"role": "user", "content": "other " * 200}]))
    state = FleetState(FLEET)
    engine = RoutingEngine(FLEET, POLICY, FixedDifficulty(0.1), state=state)
    holds = {}
    for eid, k, tail in zip(IDS, held, tail_only):
        k = min(k, len(mine))
        state.store_blocks(eid, stranger, "GPU")
        if tail and k > 1:  # every block but the first: nothing usable
            state.store_blocks(eid, mine[1:k], "GPU")
            k = 0
        elif k:
            state.store_blocks(eid, mine[:k], "GPU")
        holds[eid] = k
    for _ in range(turn):  # the tie rotation's turn, from other requests' dispatches (answered: the fleet stays idle)
        state.release(engine.route(parse_route_request({"messages": [{"role": "user", "content": "hi"}]})).decision_id)
    d = engine.route(parse_route_request({"messages": messages, "max_tokens": 64, "routing": {"explain": True}}),
                     dispatch=False)
    best = max(holds.values())
    chosen = next(eid for eid in IDS if NAMES[eid] == d.endpoints[0].name)
    assert holds[chosen] == best, (holds, d.endpoints[0].name)
    prompt = d.prompt_tokens
    for c in d.trace["endpoints"][0]["candidates"]:
        eid = next(i for i in IDS if NAMES[i] == c["endpoint"])
        assert c["local_hit_tokens"] == min(prompt, int(holds[eid] * 16 * prompt / len(ids))), (c, holds, len(ids))
