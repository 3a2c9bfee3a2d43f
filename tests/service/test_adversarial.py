"""Findings of the adversarial pass (issue 14) through the real app and its SQLite ledger and
outcome log: each test failed before its fix."""

from __future__ import annotations

from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

USER = {"role": "user", "content": "What is the capital of France?"}


def _client(tmp_path, p_hard: float = 0.2, **kw) -> TestClient:
    fleet = load_fleet()
    settings = Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0, **kw)
    engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), FixedDifficulty(p_hard),
                           state=build_state(settings, fleet))
    return TestClient(create_app(settings, engine=engine, owns_engine=True))


def test_an_unknown_served_target_is_422_and_the_hold_stays_settleable(tmp_path):
    """An outcome naming a target the fleet lacks was acknowledged 'stored' but could never settle:
    its decision's budget hold and in-flight load stayed taken, and the gateway's retry with the
    same id was a conflict or a duplicate that failed again."""
    with _client(tmp_path) as c:
        d = c.post("/v1/route", json={"messages": [USER], "routing": {"tenant": "acme"}}).json()
        state = c.app.state.fleet_state
        usage = {"prompt_tokens": 10, "completion_tokens": 30}
        r = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "served_target": "onprem-8c", "usage": usage})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"] == "served_target"
        assert "did you mean 'onprem-8b'" in r.json()["error"]["message"]
        batch = c.post("/v1/outcomes", json=[{"decision_id": d["decision_id"], "served_target": "nope", "usage": usage}])
        assert batch.json()["acks"][0]["status"] == "invalid"
        assert "[0].served_target" in batch.json()["acks"][0]["message"]
        assert state.record(d["decision_id"]) is not None  # nothing settled, nothing stored
        ok = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "served_target": d["target"], "usage": usage})
        assert ok.status_code == 200 and ok.json()["acks"][0]["status"] == "stored"
        assert ok.json()["acks"][0]["settlement"]["replayed"] is False
        assert state.record(d["decision_id"]) is None


def test_many_small_pdf_bombs_inflate_no_more_than_one_request_budget(tmp_path, monkeypatch):
    """An 11 KB PDF whose object stream inflates to 4 MiB of ``/Count 1`` cost a quarter second of the event
    loop, and each file of a request had a 4 MiB budget of its own: a 1.1 MB body of a hundred of them took 38 s
    of one core. The request's files now share one ``MAX_INFLATED``; those it leaves unread count at the most
    their target bills (the rest of its window), so the hold stays on the safe side."""
    import base64
    import zlib

    import pointsman.media

    inflated: list[int] = []
    real = zlib.decompressobj

    class Counting:
        def __init__(self) -> None:
            self.inner = real()

        def decompress(self, data: bytes, max_length: int = 0) -> bytes:
            out = self.inner.decompress(data, max_length)
            inflated.append(len(out))
            return out

        @property
        def unconsumed_tail(self) -> bytes:
            return self.inner.unconsumed_tail

        @property
        def eof(self) -> bool:
            return self.inner.eof

    monkeypatch.setattr(pointsman.media.zlib, "decompressobj", Counting)
    bomb = zlib.compress(b"/Count 1 " * (pointsman.media.MAX_INFLATED // 9 + 1), 9)
    pdf = b"%PDF-1.7\n1 0 obj << /Type /ObjStm /Filter /FlateDecode >> stream\n" + bomb + b"\nendstream\n"
    part = {"type": "file", "file": {"filename": "a.pdf",
                                     "file_data": "data:application/pdf;base64," + base64.b64encode(pdf).decode()}}
    with _client(tmp_path) as c:
        r = c.post("/v1/route", json={"messages": [{"role": "user", "content": [part] * 12}]})
    assert r.status_code in (200, 422), r.text
    assert 0 < sum(inflated) <= pointsman.media.MAX_INFLATED


def test_legacy_function_definitions_and_calls_count_as_prompt_tokens(tmp_path):
    """OpenAI's deprecated ``functions`` and an assistant's ``function_call`` are billed as input as ``tools`` and
    ``tool_calls`` are, but were ignored: 40,000 tokens of them priced the request, and held its budget, at 6-20
    tokens."""
    big = "The quick brown fox jumps over the lazy dog. " * 4000
    fn = {"name": "lookup", "description": big, "parameters": {"type": "object"}}
    with _client(tmp_path) as c:
        def tokens(body: dict) -> int:
            r = c.post("/v1/route", json=body)
            assert r.status_code == 200, r.text
            return r.json()["prompt_tokens"]

        as_tools = tokens({"messages": [USER], "tools": [{"type": "function", "function": fn}]})
        assert tokens({"messages": [USER], "functions": [fn]}) >= as_tools > 40_000
        call = {"name": "lookup", "arguments": big}
        as_tool_call = tokens({"messages": [USER, {"role": "assistant", "tool_calls": [{"id": "c1", "function": call}]},
                                            {"role": "tool", "tool_call_id": "c1", "content": "ok"}, USER]})
        assert tokens({"messages": [USER, {"role": "assistant", "function_call": call},
                                    {"role": "function", "name": "lookup", "content": "ok"}, USER]}) >= as_tool_call - 10
        bad = c.post("/v1/route", json={"messages": [USER], "tools": "x", "functions": [fn]})
        assert bad.status_code == 422 and bad.json()["error"]["param"] == "tools"


def _schema_format(description: str, responses: bool = False) -> dict:
    schema = {"type": "object", "description": description, "properties": {"answer": {"type": "string"}}}
    return ({"type": "json_schema", "name": "answer", "strict": True, "schema": schema} if responses
            else {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": schema}})


def test_a_structured_output_schema_counts_on_frontier_targets_only(tmp_path):
    """A JSON schema for structured output (Chat Completions ``response_format``, Responses ``text.format``) is put
    in the model's input and billed as input by OpenAI, but was ignored: a 45,000-token schema priced a frontier
    target as a 12-token prompt. vLLM enforces it by constrained decoding, outside the prompt, so the request's
    ``prompt_tokens`` (the estimator, P/D mode, a gateway count's plausibility) and on-prem targets do not count it
    (c41a671 counted it everywhere and was reverted). Malformed formats are accepted and count nothing."""
    big = "The quick brown fox jumps over the lazy dog. " * 4000  # ~45,000 tokens
    fleet = load_fleet()
    with _client(tmp_path) as c:
        def route(body: dict) -> dict:
            r = c.post("/v1/route", json={**body, "routing": {"explain": True}})
            assert r.status_code == 200, r.text
            return r.json()

        def costs(d: dict) -> dict[str, float]:
            return {x["target"]: x["estimated_cost_usd"] for x in d["trace"]["candidates"]}

        plain = route({"messages": [USER]})
        chat = route({"messages": [USER], "response_format": _schema_format(big)})
        responses = route({"input": USER["content"], "text": {"format": _schema_format(big, responses=True)}})
        assert plain["prompt_tokens"] < 50 and plain["target"].startswith("onprem")
        for d in (chat, responses):
            assert d["prompt_tokens"] == plain["prompt_tokens"]  # the request's count and the on-prem decision's
            assert d["trace"]["mode"]["inputs"]["prompt_tokens"] == plain["prompt_tokens"]
            for name, t in fleet.targets.items():
                added = costs(d)[name] - costs(plain)[name]
                if t.kind == "frontier":
                    assert added >= 40_000 * t.prices.usd_per_1m_input_tokens / 1e6, name
                else:
                    assert added == 0, name
        for bad in ("json_schema", 3, None, [1, 2], True, {}):
            d = route({"messages": [USER], "response_format": bad})
            assert d["prompt_tokens"] == plain["prompt_tokens"]
            assert costs(d) == costs(plain) or bad == {}, bad
        # the context-window filter: a 180,000-token schema leaves the 128,000-token frontier targets, not on-prem
        huge = route({"messages": [USER], "response_format": _schema_format(big * 4)})
        excluded = {x["target"]: (x["excluded_by"] or "").split(":")[0] for x in huge["trace"]["candidates"]}
        assert excluded == {"onprem-8b": "", "onprem-70b": "", "frontier-small": "context-window",
                            "frontier-large": "context-window"}
    with _client(tmp_path / "hard", p_hard=0.9) as c:  # a hard prompt goes to frontier-large: its count has the schema
        plain = c.post("/v1/route", json={"messages": [USER]}).json()
        d = c.post("/v1/route", json={"messages": [USER], "response_format": _schema_format(big[:len(big) // 10])}).json()
        assert plain["target"] == d["target"] == "frontier-large"
        assert d["prompt_tokens"] >= plain["prompt_tokens"] + 4_000
