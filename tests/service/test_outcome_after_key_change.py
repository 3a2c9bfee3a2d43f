"""An outcome whose decision id no key here verifies (the service restarted with another
``POINTSMAN_DECISION_KEY`` between the decision and its outcome, the key rotated) is checked against
the decision the outcome log holds. Real ``pointsman serve`` processes on one data folder."""

from __future__ import annotations

import hashlib

import httpx

from pointsman.policy.signals.signed_ids import DecisionSigner
from tests.service.conftest import stop

PROMPT = "the river runs to the sea " * 10_000  # ~60,000 tokens: three of them are more than any window


def signer(secret: str) -> DecisionSigner:
    return DecisionSigner(hashlib.sha256(secret.encode()).digest())  # as service/decision_key.py derives it


def test_a_batch_outcome_after_a_key_change_fits_the_logged_decisions_own_tokens(tmp_path, serve):
    """A Completions batch of three ~60,000-token prompts is decided (each prompt fits the window), and its
    outcome reports all its prompt tokens: more than the window x 1.1, within what the decision counted. After
    a restart with a rotated key its id verifies nowhere, so only the outcome log knows the decision: the
    outcome was refused 422 'impossible' (the decision's own tokens counted 0; the gateway's report lost, the
    spend unbooked). A single prompt's decision reporting that usage is still refused."""
    settings = {"watch_policy": "false", "scrape_interval_s": "0", "decision_log_flush_ms": "5"}
    first, base = serve(tmp_path, decision_key="first-key", **settings)
    decided = []
    for prompt in ([PROMPT] * 3, "Name a river."):
        r = httpx.post(f"{base}/v1/route", json={"model": "auto", "prompt": prompt, "max_tokens": 100}, timeout=60)
        assert r.status_code == 200, r.text[:500]
        decided.append(r.json())
    batch, one = decided
    claims = signer("first-key").verify(batch["decision_id"])
    assert claims is not None and claims.prompt_tokens > 131_072 * 1.1  # signed: its claims carry its tokens
    stop(first)  # its decisions are in the outcome log
    _, base = serve(tmp_path, decision_key="second-key", **settings)
    assert signer("second-key").verify(batch["decision_id"]) is None  # what the restarted service sees

    usage = {"prompt_tokens": claims.prompt_tokens, "completion_tokens": 200}
    r = httpx.post(f"{base}/v1/outcomes", json={"decision_id": batch["decision_id"], "status": "ok",
                                                "served_target": batch["target"], "usage": usage})
    assert r.status_code == 200, r.text  # before: 422 "... is impossible on target ..."
    assert r.json()["acks"][0]["status"] == "stored"
    r = httpx.post(f"{base}/v1/outcomes", json={"decision_id": one["decision_id"], "status": "ok",
                                                "served_target": one["target"], "usage": usage})
    assert r.status_code == 422 and "impossible" in r.text, r.text
