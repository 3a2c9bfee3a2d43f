"""Early verification through the real LiteLLM against a live ``pointsman serve`` whose policy sets
``verify.prefix_tokens``: the decision carries it, the cascade streams the draft and verifies its
first tokens while it streams; a refusal escalates at its 4th chunk (its stream closed, its 4 tokens
booked by the verify, one outcome: the escalated call's), a good draft is accepted at its prefix and
runs to its end (one outcome: the whole draft's). Upstreams stream LiteLLM's ``mock_response``."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of LiteLLM's price map

import litellm  # noqa: E402
import pytest  # noqa: E402

from pointsman.integrations.client import PointsmanClient  # noqa: E402
from pointsman.integrations.litellm_cascade import acascade  # noqa: E402
from pointsman.outcome_log.store import OutcomeLog  # noqa: E402

GATEWAY_KEY = "gw-secret-for-tests"  # the service fixture's key (conftest.py)
POLICY = (Path(__file__).resolve().parents[1] / "fixtures" / "cascade_policy.yaml").read_text().replace(
    "verify:\n", "verify:\n  prefix_tokens: 4\n")
GOOD = "Kickball is played like baseball with a rubber ball rolled to the kicker; runners circle four bases."
REFUSAL = "I'm sorry, but I cannot help with that request, and I will not explain why at any length."


def _deployment(group: str, target: str, answer: str, **params: object) -> dict:
    return {"model_name": group, "litellm_params": {"mock_response": answer, **params},
            "model_info": {"id": f"{group}-{target}", "pointsman_target": target}}


ROUTER = litellm.Router(model_list=[
    _deployment("good", "onprem-8b", GOOD, model="hosted_vllm/llama", api_base="http://onprem:8000/v1"),
    _deployment("good", "frontier-large", "frontier answer", model="openai/gpt-4o", api_key="sk-not-used"),
    _deployment("refuses", "onprem-8b", REFUSAL, model="hosted_vllm/llama", api_base="http://onprem:8000/v1"),
    _deployment("refuses", "frontier-large", "frontier answer", model="openai/gpt-4o", api_key="sk-not-used"),
    _deployment("on-prem-only", "onprem-8b", REFUSAL, model="hosted_vllm/llama", api_base="http://onprem:8000/v1"),
], num_retries=0)


@pytest.fixture(scope="module")
def policy_text() -> str:
    return POLICY


def test_the_prefix_is_verified_while_the_draft_streams(service: dict) -> None:
    async def run() -> tuple[list, PointsmanClient]:
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0, verify_timeout_s=5.0,
                                 flush_interval_s=0.01)
        decision = await client.aroute({"model": "good", "messages": [{"role": "user", "content": "hi"}]})
        assert decision is not None and decision["verify_prefix_tokens"] == 4
        client.report({"decision_id": decision["decision_id"], "status": "cancelled"})  # release that probe
        out = [await acascade(ROUTER, client, model=group, messages=[{"role": "user", "content": "Rules of kickball?"}])
               for group in ("good", "refuses")]
        for _ in range(250):
            await client.aflush()
            if len(client.acks) >= 3:
                break
            await asyncio.sleep(0.02)
        await client.aclose()
        return out, client

    (kept, escalated), client = asyncio.run(run())
    assert kept.choices[0].message.content == GOOD  # accepted at its prefix, ran to its end
    assert escalated.choices[0].message.content == "frontier answer"
    acks = list(client.acks)[1:]
    assert [a["status"] for a in acks] == ["stored", "stored"]
    good_id, bad_id = (a["decision_id"] for a in acks)
    assert acks[0]["settlement"]["decision_id"] == good_id and acks[0]["settlement"]["target"] == "onprem-8b"
    assert acks[1]["settlement"]["decision_id"].startswith(f"{bad_id}/escalation.")  # signed
    assert acks[1]["settlement"]["target"] == "frontier-large" and acks[1]["settlement"]["replayed"] is False
    with OutcomeLog(service["outcome_log"]) as log:
        good, bad = log.decision(good_id), log.decision(bad_id)
        assert len(good.outcomes) == 1 and good.outcomes[0].served_target == "onprem-8b"
        assert good.outcomes[0].usage.completion_tokens > 4  # the whole draft's usage
        assert len(bad.outcomes) == 1 and bad.outcomes[0].served_target == "frontier-large"
        v_good, v_bad = log.verification(good_id), log.verification(bad_id)
        assert v_good["action"] == "accept" and v_good["features"]["partial"] is True
        assert v_good["features"]["tokens"] == 4
        assert v_bad["action"] == "escalate" and v_bad["rule"] == "refusal"
        assert v_bad["features"]["partial"] is True and v_bad["features"]["tokens"] == 4


def test_an_escalation_no_deployment_serves_is_released_when_the_draft_was_cancelled(service: dict) -> None:
    """The refusal escalates at its prefix and its stream is closed, but the group has no deployment of the
    escalation's target: the call goes through the router unrouted, and the escalation is reported
    ``cancelled`` under its id, which releases its hold and in-flight load. Before, nothing was reported:
    the hold on frontier-large stayed counted against the budget until the reservation TTL."""
    async def run() -> PointsmanClient:
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0, verify_timeout_s=5.0,
                                 flush_interval_s=0.01)
        await acascade(ROUTER, client, model="on-prem-only", messages=[{"role": "user", "content": "Rules of tag?"}])
        for _ in range(100):
            await client.aflush()
            if client.acks:
                break
            await asyncio.sleep(0.02)
        await client.aclose()
        return client

    client = asyncio.run(run())
    assert [(a["status"], a["released"]) for a in client.acks] == [("stored", True)]
    with OutcomeLog(service["outcome_log"]) as log:
        decision = log.decision(client.acks[0]["decision_id"])
        assert [o.status for o in decision.outcomes] == ["cancelled"]
        assert log.verification(decision.decision_id)["action"] == "escalate"
