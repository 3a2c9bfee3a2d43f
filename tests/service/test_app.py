"""The decision service over HTTP (FastAPI TestClient), with an injected fixed-difficulty engine."""

import base64
import json
import random
import re

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import settings as settings_
from hypothesis import strategies as st

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.estimator.features import BATCH_COUNTED_PROMPTS
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.schemas import RouteResponse
from pointsman.service.settings import Settings

USER = {"role": "user", "content": "What is the capital of France?"}


@pytest.fixture(scope="module")
def engine():
    fleet = load_fleet()
    return RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.2))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


def settings(data_dir, **kw):
    """Settings for a test app: its own data folder, no file watcher."""
    return Settings(data_dir=data_dir, watch_policy=False, **kw)


@pytest.fixture(scope="module")
def client(engine, data_dir):
    with TestClient(create_app(settings(data_dir, max_body_bytes=1_000_000), engine=engine)) as c:
        yield c


def post(client, body, **kw):
    if isinstance(body, (bytes, str)):
        return client.post("/v1/route", content=body, headers={"content-type": "application/json"}, **kw)
    return client.post("/v1/route", json=body, **kw)


def test_route_returns_a_decision_with_headers(client):
    r = post(client, {"model": "gpt-4o", "messages": [USER], "temperature": 0.7, "stream": True,
                      "response_format": {"type": "json_object"}, "routing": {"tenant": "acme"}})
    assert r.status_code == 200
    body = r.json()
    RouteResponse.model_validate(body)
    assert (body["target"], body["rule"], body["mode"]) == ("onprem-8b", "default", "aggregated")
    assert r.headers["x-pointsman-decision-id"] == body["decision_id"]
    assert r.headers["x-pointsman-target"] == "onprem-8b"
    assert "trace" not in body


def test_explain_returns_the_trace(client):
    r = post(client, {"messages": [USER], "routing": {"explain": True}})
    assert r.status_code == 200
    trace = r.json()["trace"]
    assert [x["rule"] for x in trace["rules"]] == ["estimator-unavailable", "hard-prompt", "long-cold-prompt",
                                                    "long-warm-prompt", "medium-prompt", "default"]
    assert trace["signals"]["cache.prefix_hit_ratio [onprem-70b]"] == {"value": 0.0, "age_s": 0.0}
    assert trace["endpoints"][0]["role"] == "aggregated" and trace["mode"]["mode"] == "aggregated"
    RouteResponse.model_validate(r.json())


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": [{"type": "text", "text": "Describe"},
                                  {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}],
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": None, "tool_calls": [
         {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
     {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"},
     {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
], ids=["image", "tool-calls-and-results", "parts"])
def test_content_parts_images_tool_calls_and_results_work(client, messages):
    r = post(client, {"messages": messages, "tools": [{"type": "function", "function": {"name": "get_weather"}}],
                      "routing": {"explain": True}})
    assert r.status_code == 200, r.text
    body = r.json()
    if any(isinstance(m["content"], list) and any(p["type"] == "image_url" for p in m["content"]) for m in messages):
        assert body["target"] == "frontier-small"  # the open models are text-only
    else:
        assert body["target"] == "onprem-8b"


AUDIO = {"type": "input_audio", "input_audio": {"data": "UklGRiQAAABXQVZF" * 1000, "format": "wav"}}
PDF = {"type": "file", "file": {"filename": "report.pdf", "file_data": "data:application/pdf;base64,JVBERi0x" * 1000}}


def test_audio_and_file_parts_go_only_to_targets_that_take_them(client):
    """An input_audio or file part is content (not "prompt is empty") and needs a target declaring
    capabilities.audio / capabilities.files: the packaged fleet's open models are text-only, so a PDF
    goes to the frontier (OpenAI reads PDFs) and audio finds no target (no audio model in the fleet),
    never the on-prem Llama that cannot read either."""
    pdf = post(client, {"messages": [{"role": "user", "content": [{"type": "text", "text": "Summarize this."}, PDF]}],
                        "routing": {"explain": True}})
    assert pdf.status_code == 200, pdf.text
    assert pdf.json()["target"] == "frontier-small"
    candidates = {c["target"]: c for c in pdf.json()["trace"]["candidates"]}
    assert "file inputs" in json.dumps(candidates["onprem-8b"])
    for content in ([{"type": "text", "text": "Transcribe this."}, AUDIO], [AUDIO]):
        r = post(client, {"messages": [{"role": "user", "content": content}]})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "no_eligible_target" and "audio inputs" in r.json()["error"]["message"]


@pytest.mark.parametrize("extra", [
    {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}},
    {"messages": [USER, {"role": "assistant", "audio": {"id": "audio_abc123"}}, USER]},
], ids=["audio-answer", "earlier-audio-answer"])
def test_a_request_for_an_audio_answer_goes_only_to_targets_that_take_audio(client, extra):
    """OpenAI's audio answers (gpt-4o-audio-preview: ``modalities: ["text", "audio"]``, or an assistant turn
    referencing one by id) were routed like text: to the on-prem Llama (200, onprem-*), which answers in text
    only. They need ``capabilities.audio`` like an ``input_audio`` part: no target of the packaged fleet."""
    r = post(client, {"messages": [USER], **extra})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "no_eligible_target" and "audio inputs or outputs" in r.json()["error"]["message"]


def test_anthropic_responses_and_completions_bodies_are_read_with_every_prompt_token(client):
    """A gateway in front of Anthropic's Messages API posts its body as it is: ``/v1/route`` accepted it
    and ignored its top-level ``system`` prompt, so a 20,000-token system prompt was routed and priced as
    if absent (the same decision and cost as the bare question). Responses and Completions bodies were a
    422 'messages: Field required'. They are read as the ext_proc picker reads them now: the system
    prompt, the instructions and a prompt of token ids are counted (the ids exactly)."""
    big = "You are a meticulous assistant who checks every step. " * 2000
    question = "What is 2 + 2?"

    def tokens(body):
        r = post(client, {**body, "routing": {"explain": True}})
        assert r.status_code == 200, r.text
        return r.json()["trace"]["cost"]["prompt_tokens"]

    bare = tokens({"messages": [{"role": "user", "content": question}]})
    chat = tokens({"messages": [{"role": "system", "content": big}, {"role": "user", "content": question}]})
    assert chat > 15_000 > bare
    anthropic = tokens({"model": "claude", "max_tokens": 100, "system": [{"type": "text", "text": big}],
                        "messages": [{"role": "user", "content": question},
                                     {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "calc",
                                                                        "input": {"q": "2+2"}}]},
                                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                                   "content": "4"}]}]})
    assert anthropic >= chat
    assert tokens({"model": "auto", "instructions": big, "input": question}) >= chat
    assert tokens({"model": "auto", "prompt": list(range(5000, 5000 + 1234)), "max_tokens": 10}) == 1234
    r = post(client, {"model": "auto", "prompt": ["text", [1, 2, 3]]})
    assert err(r)[:2] == (422, "prompt")


def test_a_completions_batch_needs_its_longest_prompt_to_fit_the_window(client):
    """A Completions ``prompt`` list is a batch: each prompt is its own sequence on the engine. Two prompts of
    ~75,000 tokens were refused 422 no_eligible_target (context-window: the two joined needed ~150,000 tokens
    > window 131,072) though each fits every target alone. The window must hold the longest prompt (and the
    cap); the cost still counts every prompt's tokens, and a prompt over the window is still refused in a
    batch. Its outcome, reporting all prompts' tokens (more than one window), was refused 422 'impossible'
    (the gateway's report lost, the spend unbooked) -- found by the fresh-eyes tester."""
    prompt = "the river runs to the sea " * 11_500  # ~74,000 tokens alone, ~75,000 at most

    def decide(prompts):
        return post(client, {"model": "auto", "prompt": prompts, "max_tokens": 100, "routing": {"explain": True}})

    alone = decide(prompt)
    assert alone.status_code == 200, alone.text
    batch = decide([prompt, prompt[::-1]])
    assert batch.status_code == 200, batch.text[:500]
    assert all(c["eligible"] for c in batch.json()["trace"]["candidates"])
    assert batch.json()["trace"]["cost"]["prompt_tokens"] >= 2 * alone.json()["trace"]["cost"]["prompt_tokens"] - 10
    # its outcome reports every prompt's tokens, more than one window holds: possible (each sequence fits), stored
    d = batch.json()
    usage = {"prompt_tokens": 2 * 74_000, "completion_tokens": 200}
    acks = client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "status": "ok",
                                             "served_target": d["target"], "usage": usage}).json()["acks"]
    assert [a["status"] for a in acks] == ["stored"], acks
    one = alone.json()  # a single prompt's decision reporting a batch's usage is still impossible
    r = client.post("/v1/outcomes", json={"decision_id": one["decision_id"], "status": "ok",
                                          "served_target": one["target"], "usage": usage})
    assert r.status_code == 422 and "impossible" in r.text, r.text
    over = decide(["Name a river.", prompt + prompt])
    assert err(over)[:2] == (422, None) and "context-window: needs" in over.json()["error"]["message"]
    not_a_batch = post(client, {"messages": [USER, USER], "routing": {"batch": True}})
    assert err(not_a_batch)[:2] == (422, "routing.batch")


#: Context windows (tokens) of a fleet small enough for generated batches to cross them, by target.
SMALL_WINDOWS = {"onprem-8b": 300, "onprem-70b": 700, "frontier-small": 1500, "frontier-large": 3000}


@pytest.fixture(scope="module")
def small_windows(tmp_path_factory):
    """The app on the packaged fleet with ``SMALL_WINDOWS`` (the static policy, difficulty 0.2)."""
    tmp = tmp_path_factory.mktemp("small-windows")
    text = DEFAULT_FLEET_PATH.read_text()
    for window in SMALL_WINDOWS.values():
        text = re.sub(r"context_window_tokens: \d{6}", f"context_window_tokens: {window}", text, count=1)
    (tmp / "fleet.yaml").write_text(text)
    fleet = load_fleet(tmp / "fleet.yaml")
    assert {t: fleet.targets[t].context_window_tokens for t in SMALL_WINDOWS} == SMALL_WINDOWS
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.2))
    with TestClient(create_app(settings(tmp), engine=engine)) as c:
        yield c


WORDS = ["river", "sea", "the", "42", "naïve", "{", "}", "\n", "    ", "東京", "🙂", "x" * 120]


@settings_(max_examples=25, deadline=None)
@given(prompts=st.lists(st.builds(lambda seed, n: " ".join(random.Random(seed).choices(WORDS, k=n)),
                                  st.integers(0, 2**32), st.integers(1, 250)), min_size=2, max_size=7),
       cap=st.integers(1, 400))
def test_a_batch_fits_a_window_iff_its_longest_prompt_does(small_windows, prompts, cap):
    """Property: a Completions batch passes a target's context-window filter iff each of its prompts sent
    alone does (up to ``BATCH_COUNTED_PROMPTS`` prompts; past them the others are bounded by their bytes,
    so the batch may be refused where each prompt passes, never the reverse: the safe side)."""
    def fits(prompt):
        r = post(small_windows, {"model": "auto", "prompt": prompt, "max_tokens": cap, "routing": {"explain": True}})
        if r.status_code == 422:  # no target took it: the message names each one's filter
            return {t: f"{t} (context-window" not in r.json()["error"]["message"] for t in SMALL_WINDOWS}
        assert r.status_code == 200, r.text
        return {c["target"]: not str(c["excluded_by"] or "").startswith("context-window")
                for c in r.json()["trace"]["candidates"]}

    batch, alone = fits(prompts), [fits(p) for p in prompts]
    for target in SMALL_WINDOWS:
        each = all(a[target] for a in alone)
        assert batch[target] <= each, (target, batch, alone)  # never eligible where a prompt alone is not
        if len(prompts) <= BATCH_COUNTED_PROMPTS:
            assert batch[target] == each, (target, batch, alone)


def test_an_anthropic_body_without_a_system_prompt_is_read_with_its_blocks(client):
    """Anthropic's Messages API needs no top-level ``system``: a tool-use turn (``tool_use`` and ``tool_result``
    blocks) or a PDF (``document`` block) without one was a 422 ``Input tag 'tool_use' ... does not match``
    from ``/v1/route``, which read a body as Anthropic's only when it had a ``system``, while the ext_proc
    picker reads the blocks whatever the body holds. The tool result's text counts; the document needs a
    target that takes files, as an OpenAI ``file`` part does."""
    result = "The forecast for Paris: sunny, 25 C, light wind from the west. " * 200

    def decide(messages):
        r = post(client, {"model": "claude", "max_tokens": 100, "messages": messages, "routing": {"explain": True}})
        assert r.status_code == 200, r.text
        return r.json()

    tools = decide([{"role": "user", "content": "What is the weather in Paris?"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                                       "input": {"city": "Paris"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": result}]}])
    assert tools["trace"]["cost"]["prompt_tokens"] > 2_000
    doc = decide([{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}},
        {"type": "text", "text": "Summarize this."}]}])
    assert doc["target"] == "frontier-small"
    candidates = {c["target"]: c for c in doc["trace"]["candidates"]}
    assert "file inputs" in json.dumps(candidates["onprem-8b"])


def test_an_image_in_a_tool_result_is_an_image_not_its_base64(client):
    """A computer-use turn returns its screenshot as an ``image`` block inside a ``tool_result`` (Anthropic; a
    Responses ``function_call_output`` may hold ``input_image`` items, a ``computer_call_output`` is one): the
    tool result's content was read as its JSON, so a 600 KB screenshot counted as 559,869 prompt tokens and
    every target was refused (context-window), while the same image as a message block is ~800 tokens. The
    blocks are parts now: an image counts as an image and needs a target that takes images."""
    png = base64.b64encode(bytes(range(256)) * 2400).decode()  # ~800 KB of base64
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}

    def decide(body):
        r = post(client, {**body, "routing": {"explain": True}})
        assert r.status_code == 200, r.text
        candidates = {c["target"]: c for c in r.json()["trace"]["candidates"]}
        assert "image inputs" in json.dumps(candidates["onprem-8b"])
        return r.json()["prompt_tokens"]

    anthropic = decide({"model": "claude", "max_tokens": 1024, "system": "You control a computer.", "messages": [
        {"role": "user", "content": "What is on the screen?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "computer",
                                           "input": {"action": "screenshot"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "screenshot taken"}, image]}]}]})
    responses = decide({"model": "auto", "input": [
        {"role": "user", "content": "What is on the screen?"},
        {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_image", "image_url": f"data:image/png;base64,{png}"}]}]})
    computer = decide({"model": "computer-use-preview", "input": [
        {"role": "user", "content": "What is on the screen?"},
        {"type": "computer_call", "call_id": "c1", "action": {"type": "screenshot"}},
        {"type": "computer_call_output", "call_id": "c1",
         "output": {"type": "computer_screenshot", "image_url": f"data:image/png;base64,{png}"}}]})
    # the chosen target's count: the image (its bytes no PNG header) at the most a target bills, gpt-4o-mini's 48,169
    assert anthropic < 48_169 + 5_000 and responses < 48_169 + 5_000 and computer < 48_169 + 5_000


def test_null_optional_fields_are_accepted(client):
    r = post(client, {"model": None, "messages": [USER, {"role": "assistant", "content": None, "name": None,
                                                          "tool_calls": None}, USER],
                      "tools": None, "max_tokens": None, "max_completion_tokens": None, "user": None,
                      "routing": None})
    assert r.status_code == 200, r.text
    r = post(client, {"messages": [USER], "routing": {"tenant": None, "session_id": None, "explain": None}})
    assert r.status_code == 200 and "trace" not in r.json()


def err(r):
    e = r.json()["error"]
    return r.status_code, e["param"], e["message"]


@pytest.mark.parametrize("body,status,param,message", [
    (b"", 400, None, "request body is empty"),
    (b"{\"messages\": [", 400, None, "malformed JSON: Expecting value at line 1 column 15"),
    (b"{\"messages\": [{\"role\": \"user\", \"content\": \"caf\xe9\"}]}", 400, None,
     "request body is not valid UTF-8 (byte 0xe9 at offset 46)"),
    (b"[1, 2]", 422, None, "expected a JSON object, got list"),
    ({"messages": []}, 422, "messages", "the message list is empty"),
    ({"messages": "hi"}, 422, "messages", "Input should be a valid list"),
    ({"messages": None}, 422, "messages", "Input should be a valid list"),
    ({}, 422, "messages", "Field required"),
    ({"messages": [{"role": "user", "content": ""}]}, 422, "messages", "prompt is empty"),
    ({"messages": [{"role": "user", "content": 5}]}, 422, "messages[0].content", "content must be a string"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 422, "messages[0].role", "Input should be"),
    ({"messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]}, 422, "messages[0].content[0]",
     "Input tag 'video'"),
    ({"messages": [{"role": "tool", "content": [{"type": []}]}]}, 422, "messages[0].content[0]", "Input tag"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 422, "messages[0].content[0].text", "Field required"),
    ({"messages": [USER], "max_tokens": "lots"}, 422, "max_tokens", "Input should be a valid integer"),
    ({"messages": [USER], "max_tokens": 0}, 422, "max_tokens", "Input should be greater than or equal to 1"),
    ({"messages": [USER], "max_tokens": True}, 422, "max_tokens", "expected an integer, got a boolean"),
    ({"messages": [USER], "max_completion_tokens": False}, 422, "max_completion_tokens",
     "expected an integer, got a boolean"),
    ({"messages": [USER], "routing": {"prompt_tokens": True}}, 422, "routing.prompt_tokens",
     "expected an integer, got a boolean"),
    ({"messages": [USER], "routing": {"prefix_block_hashes": [7, True]}}, 422, "routing.prefix_block_hashes[1]",
     "expected an integer, got a boolean"),
    ({"messages": [USER], "routing": {"tenat": "acme"}}, 422, "routing.tenat", "unknown field; did you mean 'tenant'?"),
    ({"messages": [USER], "routing": {"explain": "please"}}, 422, "routing.explain", "Input should be a valid boolean"),
    ({"messages": [USER], "routing": []}, 422, "routing", "Input should be a valid dictionary"),
    ({"messages": [None]}, 422, "messages[0]", "Input should be a valid dictionary"),
    ({"messages": [{"role": "user", "content": [None]}]}, 422, "messages[0].content[0]", "Input should be a valid"),
    ({"messages": [{"role": None, "content": "x"}]}, 422, "messages[0].role", "Input should be"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}, 422,
     "messages[0].content[0].text", "Input should be a valid string"),
    (b"{\"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}]}", 422, "messages[0].content", "content is not valid UTF-8"),
], ids=lambda v: v if isinstance(v, int) else None)
def test_bad_input_is_a_4xx_naming_the_field(client, body, status, param, message):
    r = post(client, body)
    got_status, got_param, got_message = err(r)
    assert (got_status, got_param) == (status, param), r.text
    assert got_message.startswith(message), got_message


def test_other_openai_fields_stay_lenient(client):
    r = post(client, {"messages": [USER], "temperature": True, "stream": 1, "max_tokens": "64", "n": True})
    assert r.status_code == 200, r.text


def test_body_over_the_limit_is_413_naming_the_limit(engine, tmp_path):
    with TestClient(create_app(settings(tmp_path, max_body_bytes=8 * 1024 * 1024), engine=engine)) as c:
        prompt = "x" * 10_000_000  # a 10 MB prompt
        r = post(c, json.dumps({"messages": [{"role": "user", "content": prompt}]}))
        assert r.status_code == 413
        assert r.json()["error"]["message"] == (
            "request body is 10,000,047 bytes; the limit is 8,388,608 bytes (setting POINTSMAN_MAX_BODY_BYTES)")


def test_body_limit_is_configurable_and_checked_without_content_length(engine, tmp_path):
    with TestClient(create_app(settings(tmp_path, max_body_bytes=100), engine=engine)) as c:
        assert post(c, {"messages": [USER]}).status_code == 200
        r = post(c, {"messages": [{"role": "user", "content": "y" * 200}]})
        assert r.status_code == 413 and "the limit is 100 bytes" in r.json()["error"]["message"]
        chunks = iter([b"{\"messages\": [", b"{\"role\": \"user\", \"content\": \"" + b"z" * 150 + b"\"}]}"])
        r = c.post("/v1/route", content=chunks)  # streamed, no Content-Length
        assert r.status_code == 413  # the rest was read and discarded first: the size is exact
        assert r.json()["error"]["message"].startswith("request body is 197 bytes; the limit is 100 bytes")


def test_a_prompt_larger_than_every_context_window_is_a_clear_422(engine, tmp_path):
    with TestClient(create_app(settings(tmp_path, max_body_bytes=20_000_000), engine=engine)) as c:
        r = post(c, {"messages": [{"role": "user", "content": "x" * 10_000_000}]})
        assert r.status_code == 422
        e = r.json()["error"]
        assert e["type"] == "no_eligible_target"
        assert e["message"].startswith("no eligible target:") and "context-window" in e["message"]


def test_healthz(client, engine):
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "policy": "static", "policy_revision": engine.policy.revision,
                        "fleet_revision": engine.fleet.revision,
                        "estimator": {"version": "fixed", "available": True, "error": None, "source": None},
                        "auth": False, "last_swap": None, "model_follow": None}


def test_openapi_documents_the_request_body(client):
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/v1/route"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/RouteRequest"}
    assert {"RouteRequest", "ChatMessage", "RoutingContext", "RouteResponse", "ErrorResponse"} <= set(spec["components"]["schemas"])


def test_lifespan_builds_the_engine_from_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("POINTSMAN_MODEL", str(tmp_path / "no-such-model"))
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("POINTSMAN_POLICY_PATH", str(STATIC_POLICY_PATH))  # its estimator-unavailable rule
    with TestClient(create_app()) as c:
        r = post(c, {"messages": [USER]})
        assert r.status_code == 200
        health = c.get("/healthz").json()
        state = c.app.state.fleet_state
        assert state.ledger is not None and state.record(r.json()["decision_id"]) is not None
    # whatever the estimator module's state, a missing model leaves routing working
    if not health["estimator"]["available"]:
        assert r.json()["rule"] == "estimator-unavailable"


def test_serving_path_imports_no_training_libraries(tmp_path):
    """The service with the bundled estimator routes a request without torch, scikit-learn or MLflow."""
    import subprocess
    import sys

    code = ("import sys\nfrom fastapi.testclient import TestClient\nfrom pointsman.service.app import create_app\n"
            "with TestClient(create_app()) as c:\n"
            "    assert c.post('/v1/route', json={'messages': [{'role': 'user', 'content': 'hi'}]}).status_code == 200\n"
            "print(sorted(m for m in ('torch', 'sklearn', 'mlflow', 'pandas') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "ORT_DISABLE_TELEMETRY": "1",
                              "POINTSMAN_DATA_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
