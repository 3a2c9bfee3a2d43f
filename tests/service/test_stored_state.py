"""A Responses request continuing provider-stored state (``previous_response_id``, ``conversation``, an
``item_reference`` input item) is routed only to a target holding that state, over HTTP (``POST /v1/route``) and
the ext_proc picker (real gRPC, real protos) alike; its counted prompt is said to leave the stored turns out
(``trace.uncounted_input``)."""

from __future__ import annotations

import base64
import json

import pytest
from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, holds_stored_state, parse_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings
from tests.service.test_ext_proc import REQUEST_HEADERS, request_phase, run, set_headers

CONTINUED = {"model": "auto", "previous_response_id": "resp_abc", "input": "And the next step?"}
IN_CONVERSATION = {"model": "auto", "conversation": {"id": "conv_abc"}, "input": "And the next step?"}
REFERENCING = {"model": "auto", "input": [{"type": "item_reference", "id": "msg_abc"},
                                          {"role": "user", "content": "And the next step?"}]}
TEMPLATED = {"model": "auto", "prompt": {"id": "pmpt_abc", "version": "2", "variables": {"topic": "tides"}}}
TEMPLATED_INPUT = {"model": "auto", "prompt": {"id": "pmpt_abc"}, "input": "And the next step?"}
RESPONSES = {**REQUEST_HEADERS, ":path": "/v1/responses"}
ON_PREM = ("onprem-8b", "onprem-70b")


def _app(tmp_path_factory, name: str, holders: bool):
    """An app on the packaged fleet; ``holders`` False: its OpenAI targets declare ``stored_state: false``."""
    text = DEFAULT_FLEET_PATH.read_text(encoding="utf-8")
    if not holders:
        text = text.replace("    provider: openai\n", "    provider: openai\n    stored_state: false\n")
    fleet = parse_fleet(text, str(DEFAULT_FLEET_PATH))
    settings = Settings(data_dir=tmp_path_factory.mktemp(name), watch_policy=False, watch_fleet=False,
                        scrape_interval_s=0, ext_proc_port=0)
    engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.1),
                           state=build_state(settings, fleet))
    return TestClient(create_app(settings, engine=engine, owns_engine=True))


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with _app(tmp_path_factory, "holders", True) as c:
        yield c


@pytest.fixture(scope="module")
def no_holder(tmp_path_factory):
    with _app(tmp_path_factory, "none", False) as c:
        yield c


def route(client: TestClient, body: dict) -> dict:
    r = client.post("/v1/route", json={**body, "routing": {"explain": True}})
    assert r.status_code == 200, r.text
    return r.json()


def picked(client: TestClient, body: dict) -> dict:
    """The ext_proc picker's answer to ``body`` sent to /v1/responses: its set headers, or its immediate response."""
    async def scenario(stub, _):
        call = stub.Process()
        out = await request_phase(call, json.dumps(body).encode(), headers=RESPONSES)
        await call.done_writing()
        return out[0]
    first = run(client.app, scenario)
    return first["immediateResponse"] if "immediateResponse" in first else set_headers(first)


@pytest.mark.parametrize("body, field", [(CONTINUED, "previous_response_id"), (IN_CONVERSATION, "conversation"),
                                         (REFERENCING, "item_reference"), (TEMPLATED, "prompt"),
                                         (TEMPLATED_INPUT, "prompt")],
                         ids=["previous_response_id", "conversation", "item_reference", "prompt", "prompt+input"])
def test_continued_state_goes_only_to_a_target_holding_it(client, body, field):
    """The tester's request went to onprem-70b as if 'And the next step?' stood alone (9 prompt tokens): an
    on-prem engine has no such response and fails or loses the context."""
    d = route(client, body)
    assert d["target"] in ("frontier-small", "frontier-large")
    excluded = {c["target"]: c["excluded_by"] for c in d["trace"]["candidates"]}
    for name in ON_PREM:
        assert excluded[name] == (f"capabilities: does not hold the provider-stored state the request's {field} "
                                  "continues (fleet: stored_state)")
    assert d["trace"]["uncounted_input"] == [f"stored state ({field})"]
    assert picked(client, body)["x-pointsman-target"] == d["target"]  # the picker decides alike


@pytest.mark.parametrize("extra", [{}, {"store": True}, {"store": False}, {"background": True, "store": True},
                                   {"previous_response_id": None}, {"conversation": None}, {"previous_response_id": ""}])
def test_a_request_standing_alone_routes_as_its_chat_request(client, extra):
    """Without stored state (storing its own answer, ``store``, or running in the background is no dependence on
    an earlier one) a Responses request decides as the same chat request: on-prem, nothing excluded."""
    d = route(client, {"model": "auto", "input": "And the next step?", **extra})
    c = route(client, {"model": "auto", "messages": [{"role": "user", "content": "And the next step?"}]})
    assert (d["target"], d["prompt_tokens"], d["estimated_cost_usd"]) == (c["target"], c["prompt_tokens"],
                                                                           c["estimated_cost_usd"])
    assert d["target"] in ON_PREM
    assert all(x["eligible"] for x in d["trace"]["candidates"])
    assert d["trace"]["uncounted_input"] == []
    assert picked(client, {"model": "auto", "input": "And the next step?", **extra})["x-pointsman-target"] == d["target"]


def test_a_stored_prompt_templates_variables_are_counted_and_read(client):
    """A stored prompt template (``prompt``: its id and ``variables``, no ``input``) was refused 400 as a malformed
    Completions prompt. Its variables are substituted into the provider's text and billed as input: counted as the
    same text sent as a message, and an image variable is an image to the capability filter (not base64 read as
    text)."""
    text = "The tides are caused by the gravitational pull of the Moon and the Sun on the oceans. " * 40
    d = route(client, {"model": "auto", "prompt": {"id": "pmpt_abc", "variables": {"passage": text}}})
    c = route(client, {"model": "auto", "messages": [{"role": "user", "content": text}]})
    assert c["prompt_tokens"] < d["prompt_tokens"] < c["prompt_tokens"] + 20  # and the template's id and version
    image = {"type": "input_image", "image_url": "data:image/png;base64," + "A" * 40_000}
    d = route(client, {"model": "auto", "prompt": {"id": "pmpt_abc", "variables": {"chart": image}}})
    excluded = {c["target"]: c["excluded_by"] for c in d["trace"]["candidates"]}
    assert excluded["onprem-8b"] == "capabilities: does not accept image inputs", excluded
    # an image's tokens (its header unread: the most gpt-4o-mini bills, 48,169), not 40,000 characters of base64
    assert d["target"] == "frontier-small" and d["prompt_tokens"] < 48_169 + 2_000, d["prompt_tokens"]


@pytest.mark.parametrize("template, field", [({}, "prompt.id"), ({"text": "hello"}, "prompt.id"), ({"id": ""}, "prompt.id"),
                                             ({"id": 7}, "prompt.id"),
                                             ({"id": "pmpt_abc", "variables": "notadict"}, "prompt.variables")])
def test_a_prompt_object_that_names_no_template_is_refused(client, template, field):
    """Any object in ``prompt`` was read as a stored template (found by a tester the day it landed): ``{}`` or
    ``{"text": "hello"}`` (a client's bug) then went to the frontier as provider-stored state. A template is named by
    a non-empty ``id``, its variables an object; anything else is a 422 naming the field, over HTTP and ext_proc."""
    r = client.post("/v1/route", json={"model": "auto", "prompt": template})
    assert r.status_code == 422 and r.json()["error"]["param"] == field, r.text
    imm = picked(client, {"model": "auto", "prompt": template})
    assert imm["status"]["code"] == "BadRequest" and field in json.loads(base64.b64decode(imm["body"]))["error"]["param"]


def test_no_target_holding_the_state_is_no_eligible_target(no_holder):
    """A fleet whose frontier targets declare ``stored_state: false``: nothing can continue the response."""
    r = no_holder.post("/v1/route", json=CONTINUED)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "no_eligible_target"
    considered = err["message"].removeprefix("no eligible target: ").split("; ")
    assert len(considered) > 1 and all("(capabilities: does not hold the provider-stored state the request's "
                                       "previous_response_id continues" in c for c in considered), considered
    imm = picked(no_holder, CONTINUED)
    assert imm["status"]["code"] == "ServiceUnavailable"  # the picker's no_eligible_target, as for any filter
    assert json.loads(base64.b64decode(imm["body"]))["error"]["message"] == err["message"]
    assert route(no_holder, {"model": "auto", "input": "And the next step?"})["target"] in ON_PREM


def test_the_trace_names_what_the_count_leaves_out_unless_the_gateway_counted(client):
    """The stored turns are billed as input but not in the request: its count and cost are lower bounds, as a file
    part's; a gateway's ``routing.prompt_tokens`` counts them, and then nothing is left out."""
    pdf = {"type": "input_file", "file_data": "data:application/pdf;base64,JVBERi0="}
    body = {**CONTINUED, "input": [{"role": "user", "content": [{"type": "input_text", "text": "Sum it up."}, pdf]}]}
    assert route(client, body)["trace"]["uncounted_input"] == ["stored state (previous_response_id)", "file parts"]
    r = client.post("/v1/route", json={**CONTINUED, "routing": {"explain": True, "prompt_tokens": 40_000}})
    assert r.status_code == 200, r.text
    assert (r.json()["prompt_tokens"], r.json()["trace"]["uncounted_input"]) == (40_000, [])


@pytest.mark.parametrize("provider, declared, holds", [("openai", "", True), ("azure", "", True),
                                                        ("anthropic", "", False), ("xai", "", False),
                                                        ("anthropic", "    stored_state: true\n", True),
                                                        ("openai", "    stored_state: false\n", False)])
def test_which_targets_hold_stored_state(provider, declared, holds):
    """Left out, ``stored_state`` is true for the providers whose Responses API stores state (OpenAI, Azure
    OpenAI): another provider's API, even one storing its own responses (xAI), has not stored OpenAI's; an
    on-prem pool never holds it."""
    text = DEFAULT_FLEET_PATH.read_text(encoding="utf-8").replace(
        "    provider: openai\n", f"    provider: {provider}\n{declared}")
    fleet = parse_fleet(text, str(DEFAULT_FLEET_PATH))
    assert {n: holds_stored_state(t) for n, t in fleet.targets.items()} == {
        "onprem-8b": False, "onprem-70b": False, "frontier-small": holds, "frontier-large": holds}
