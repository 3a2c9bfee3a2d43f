"""The cascade through the real LiteLLM (``integrations/litellm_cascade.py``) against a live
``pointsman serve`` whose policy has a verify section: a good on-prem draft is kept, a refusal
escalates to the frontier deployment, and each decision gets one outcome (the escalated call's,
settling the escalation) in the service's outcome log. Upstreams answer with LiteLLM's
documented ``mock_response`` (no network)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of LiteLLM's price map

import litellm  # noqa: E402
import pytest  # noqa: E402

from pointsman.integrations.client import PointsmanClient  # noqa: E402
from pointsman.integrations.litellm_cascade import acascade  # noqa: E402
from pointsman.integrations.litellm_router import attach  # noqa: E402
from pointsman.outcome_log.store import OutcomeLog  # noqa: E402

GATEWAY_KEY = "gw-secret-for-tests"  # the service fixture's key (conftest.py)

POLICY = (Path(__file__).resolve().parents[1] / "fixtures" / "cascade_policy.yaml").read_text()
GOOD = ("Kickball is played like baseball with a rubber ball rolled to the kicker; runners circle four bases "
        "and the team with more runs after the innings wins.")


async def _settle(client: PointsmanClient, n_acks: int) -> None:
    """Wait (up to 5 s) until ``n_acks`` outcomes are acknowledged, then close the client."""
    for _ in range(250):
        await client.aflush()
        if len(client.acks) >= n_acks:
            break
        await asyncio.sleep(0.02)
    await client.aclose()


def _deployment(group: str, target: str, answer: str, **params: object) -> dict:
    return {"model_name": group, "litellm_params": {"mock_response": answer, **params},
            "model_info": {"id": f"{group}-{target}", "pointsman_target": target}}


ROUTER = litellm.Router(model_list=[
    _deployment("good", "onprem-8b", GOOD, model="hosted_vllm/llama", api_base="http://onprem:8000/v1"),
    _deployment("good", "frontier-large", "frontier answer", model="openai/gpt-4o", api_key="sk-not-used"),
    _deployment("refuses", "onprem-8b", "I'm sorry, but I cannot help with that.", model="hosted_vllm/llama",
                api_base="http://onprem:8000/v1"),
    _deployment("refuses", "frontier-large", "frontier answer", model="openai/gpt-4o", api_key="sk-not-used"),
    _deployment("no-frontier", "onprem-8b", "I'm sorry, but I cannot help with that.", model="hosted_vllm/llama",
                api_base="http://onprem:8000/v1"),
    _deployment("fallback-only", "frontier-small", "I'm sorry, but I cannot help with that.", model="openai/gpt-4o-mini",
                api_key="sk-not-used"),
], num_retries=0)


@pytest.fixture(scope="module")
def policy_text() -> str:
    return POLICY


def test_a_good_draft_is_kept_and_a_refusal_escalates_once(service: dict) -> None:
    async def run() -> tuple[list, PointsmanClient]:
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0, verify_timeout_s=5.0,
                                 flush_interval_s=0.01)
        queue = client.report
        client.report = lambda outcome: (reported.append(str(outcome["decision_id"])), queue(outcome))[1]  # type: ignore[method-assign]
        out = [await acascade(ROUTER, client, model=group, messages=[{"role": "user", "content": "Rules of kickball?"}])
               for group in ("good", "refuses")]
        await _settle(client, 2)
        return out, client

    reported: list[str] = []
    (kept, escalated), client = asyncio.run(run())
    assert kept.choices[0].message.content == GOOD
    assert escalated.choices[0].message.content == "frontier answer"
    assert client.stats["verified"] == 2 and client.stats["verify_failed"] == 0
    acks = list(client.acks)
    assert [a["status"] for a in acks] == ["stored", "stored"]
    assert acks[0]["settlement"]["decision_id"] == acks[0]["decision_id"]
    assert acks[1]["settlement"]["decision_id"].startswith(acks[1]["decision_id"] + "/escalation.")  # signed
    assert acks[1]["settlement"]["target"] == "frontier-large"
    # the escalated call is reported under its signed escalation id, which any replica settles
    assert reported == [acks[0]["decision_id"], acks[1]["settlement"]["decision_id"]]
    with OutcomeLog(service["outcome_log"]) as log:
        good, bad = (log.decision(a["decision_id"]) for a in acks)
        assert len(good.outcomes) == 1 and good.outcomes[0].served_target == "onprem-8b"
        assert len(bad.outcomes) == 1 and bad.outcomes[0].served_target == "frontier-large"
        assert log.verification(acks[1]["decision_id"])["rule"] == "refusal"
        assert log.verification(acks[0]["decision_id"])["action"] == "accept"


def test_pointsman_down_fails_open_to_the_router() -> None:
    async def run() -> object:
        client = PointsmanClient("http://127.0.0.1:9", route_timeout_s=0.5)
        router = litellm.Router(model_list=[dict(d) for d in ROUTER.model_list], num_retries=0)
        attach(router, client)  # Pointsman down: the strategy picks the group's first deployment (the draft's)
        answer = await acascade(router, client, model="refuses", messages=[{"role": "user", "content": "hi"}])
        await client.aclose()
        return answer

    for _ in range(3):  # the default deployment every time, not LiteLLM's random pick
        assert asyncio.run(run()).choices[0].message.content.startswith("I'm sorry")


def test_an_escalation_no_deployment_serves_keeps_the_draft_and_releases_its_hold(service: dict) -> None:
    """No deployment of the group serves the escalation's target: the draft (settled at the verify) is
    the answer, and the escalation is reported ``cancelled`` under its id, which releases its hold; the
    draft's own outcome is not reported again (the verifying replica would refuse it)."""
    async def run() -> tuple[object, PointsmanClient]:
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0, verify_timeout_s=5.0,
                                 flush_interval_s=0.01)
        answer = await acascade(ROUTER, client, model="no-frontier", messages=[{"role": "user", "content": "Hi?"}])
        await _settle(client, 1)
        return answer, client

    answer, client = asyncio.run(run())
    assert answer.choices[0].message.content.startswith("I'm sorry")
    (ack,) = client.acks
    assert ack["status"] == "stored" and ack["released"] is True and ack.get("settle_error") is None
    with OutcomeLog(service["outcome_log"]) as log:
        (stored,) = log.decision(ack["decision_id"]).outcomes
        assert stored.status == "cancelled"


def test_a_draft_from_the_decision_s_fallback_is_verified_and_booked_as_that_target_s(service: dict) -> None:
    """The group has no deployment of the decided onprem-8b, so the draft runs on its fallback frontier-small
    (``pick_deployment``). The verify names that target, so the draft is settled at frontier-small's prices
    (its refusal escalates to frontier-large, which no deployment serves: the draft is kept, the escalation
    released). Before, the verify sent no ``served_target``: the frontier-small draft was settled at onprem-8b's
    GPU price, and its outcome booked nothing more."""
    async def run() -> tuple[object, PointsmanClient]:
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0, verify_timeout_s=5.0,
                                 flush_interval_s=0.01)
        sent: list[dict] = []
        verify = client.averify

        async def spy(decision_id, draft, usage=None, served_target=None):  # type: ignore[no-untyped-def]
            sent.append({"served_target": served_target})
            answer = await verify(decision_id, draft, usage, served_target)
            sent[-1]["answer"] = answer
            return answer

        client.averify = spy  # type: ignore[method-assign]
        answer = await acascade(ROUTER, client, model="fallback-only", messages=[{"role": "user", "content": "Hi?"}])
        await _settle(client, 1)
        return answer, client, sent

    answer, client, sent = asyncio.run(run())
    assert answer.choices[0].message.content.startswith("I'm sorry")  # no frontier-large deployment: the draft
    (verified,) = sent
    assert verified["served_target"] == "frontier-small"  # before: None
    assert verified["answer"]["draft_settlement"]["target"] == "frontier-small"  # before: onprem-8b
