"""The outcome of a LiteLLM call names the target of the deployment that served it. The proxy
callback pins the deployment Pointsman chose (``async_filter_deployments``), but when that one is not
among the healthy deployments (cooling down after failures) LiteLLM's own pick serves the call; its
outcome then said ``served_target`` the chosen one's, so a frontier answer was booked at the on-prem
price. Driven through the real LiteLLM (``mock_response``) and its logging hooks against a live
``pointsman serve``: the call carries the decision as the pre-call hook leaves it, pinned to an
on-prem deployment the router does not have, and is served by the frontier deployment."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of LiteLLM's price map

import litellm  # noqa: E402
import pytest  # noqa: E402

from pointsman.integrations.client import PointsmanClient  # noqa: E402
from pointsman.integrations.litellm_proxy import PointsmanProxyHandler  # noqa: E402
from pointsman.integrations.litellm_router import DECISION_KEY  # noqa: E402

GATEWAY_KEY = "gw-secret-for-tests"  # the service fixture's key (conftest.py)


@pytest.fixture(scope="module")
def policy_text() -> str:
    return (Path(__file__).resolve().parents[1] / "fixtures" / "cascade_policy.yaml").read_text()


def test_the_outcome_is_priced_on_the_deployment_that_served_it(service: dict) -> None:
    router = litellm.Router(model_list=[
        {"model_name": "chat", "litellm_params": {"model": "openai/gpt-4o", "api_key": "sk-not-used",
                                                  "mock_response": "frontier answer"},
         "model_info": {"id": "gpt-4o", "pointsman_target": "frontier-large"}}], num_retries=0)

    async def run() -> tuple[dict, list]:
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0, flush_interval_s=0.01)
        handler = PointsmanProxyHandler(client=client, cascade=False)
        decision = await client.aroute({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
        assert decision is not None and decision["target"] == "onprem-8b"
        pinned = {"id": decision["decision_id"], "target": "onprem-8b", "served_target": "onprem-8b",
                  "client": id(client), "deployment": "llama-8b", "cascade": False}
        saved = list(litellm.callbacks)
        litellm.callbacks = [handler]
        try:
            await router.acompletion(model="chat", messages=[{"role": "user", "content": "hi"}],
                                     metadata={DECISION_KEY: pinned})
            for _ in range(250):
                await client.aflush()
                if client.acks:
                    break
                await asyncio.sleep(0.02)
        finally:
            litellm.callbacks = saved
        await client.aclose()
        return decision, list(client.acks)

    decision, acks = asyncio.run(run())
    assert len(acks) == 1 and acks[0]["status"] == "stored", acks
    assert acks[0]["settlement"]["target"] == "frontier-large"


def test_a_cascade_draft_answered_by_another_deployment_is_not_verified_as_the_decision_s(service: dict,
                                                                                      monkeypatch) -> None:
    """The proxy's cascade: the chosen on-prem deployment was cooling down and LiteLLM's own pick, the
    frontier deployment, answered. Before, the post-call hook verified that answer as the on-prem draft and
    reported it served by onprem-8b (a frontier answer booked at the on-prem price). Now the answer's
    deployment (LiteLLM's ``model_id``) names its target: no verify, and its outcome is booked there."""
    from pointsman.integrations import litellm_proxy

    router = litellm.Router(model_list=[
        {"model_name": "chat", "litellm_params": {"model": "openai/gpt-4o", "api_key": "sk-not-used",
                                                  "mock_response": "frontier answer"},
         "model_info": {"id": "gpt-4o", "pointsman_target": "frontier-large"}}], num_retries=0)
    monkeypatch.setattr(litellm_proxy, "_router", lambda: router)

    async def run() -> tuple[dict, object, list]:
        client = PointsmanClient(service["url"], api_key=GATEWAY_KEY, route_timeout_s=5.0, flush_interval_s=0.01)
        handler = PointsmanProxyHandler(client=client, cascade=True)
        decision = await client.aroute({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
        assert decision is not None and decision["target"] == "onprem-8b"
        pinned = {"id": decision["decision_id"], "target": "onprem-8b", "served_target": "onprem-8b",
                  "client": id(client), "deployment": "llama-8b", "cascade": True, "group": "chat"}
        data = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "metadata": {DECISION_KEY: pinned}}
        response = await router.acompletion(model="chat", messages=data["messages"], metadata={DECISION_KEY: pinned})
        replaced = await handler.async_post_call_success_hook(data, None, response)
        for _ in range(250):
            await client.aflush()
            if client.acks:
                break
            await asyncio.sleep(0.02)
        await client.aclose()
        return decision, replaced, list(client.acks)

    decision, replaced, acks = asyncio.run(run())
    assert replaced is None
    assert len(acks) == 1 and acks[0]["status"] == "stored", acks
    assert acks[0]["settlement"]["target"] == "frontier-large"
