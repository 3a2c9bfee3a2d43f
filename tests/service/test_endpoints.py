"""Every endpoint besides /v1/route over HTTP (FastAPI TestClient): outcomes, telemetry, fleet,
policy read/validate/reload, probes, metrics, and the auth matrix."""

import hashlib
import shutil
import time

import pytest
from fastapi.testclient import TestClient

from pointsman.estimator.estimate import DifficultyEstimate, FixedDifficulty
from pointsman.outcome_log.store import OutcomeLog
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings

USER = {"role": "user", "content": "What is the capital of France?"}
GATEWAY, ADMIN, TELEMETRY = "gw-secret-0123", "admin-secret-0123", "sidecar-secret-0123"


def make_app(tmp_path, estimator=None, **kw):
    """An app on a copy of the default policy in ``tmp_path`` (so reload tests can edit it)."""
    policy_path = tmp_path / "policy.yaml"
    if not policy_path.exists():
        shutil.copy(STATIC_POLICY_PATH, policy_path)
    fleet = load_fleet()
    settings = Settings(data_dir=tmp_path, policy_path=policy_path, watch_policy=False, **kw)
    engine = RoutingEngine(fleet, load_policy(policy_path, fleet), estimator or FixedDifficulty(0.2),
                           state=build_state(settings, fleet))
    return create_app(settings, engine=engine, owns_engine=True), policy_path


@pytest.fixture
def client(tmp_path):
    app, _ = make_app(tmp_path)
    with TestClient(app) as c:
        yield c


def route(c, **kw):
    r = c.post("/v1/route", json={"messages": [USER]}, **kw)
    assert r.status_code == 200, r.text
    return r.json()


def test_outcome_settles_the_budget_releases_load_and_is_stored(client, tmp_path):
    d = route(client)
    state = client.app.state.fleet_state
    assert state.record(d["decision_id"]) is not None  # in flight
    r = client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "ttft_ms": 120, "tpot_ms": 20,
                                          "usage": {"prompt_tokens": 12, "completion_tokens": 40},
                                          "quality": {"user_rating": 1.0}})
    assert r.status_code == 200, r.text
    ack = r.json()["acks"][0]
    assert ack["status"] == "stored" and ack["settlement"]["released_load"] == 1
    assert ack["settlement"]["actual_cost_usd"] > 0 and ack["settlement"]["target"] == d["target"]
    assert state.record(d["decision_id"]) is None
    with OutcomeLog(tmp_path / "outcomes.db") as log:
        logged = log.decision(d["decision_id"])
        assert logged is not None and logged.outcomes[0].ttft_ms == 120
    # the same outcome again: a duplicate, settled once only
    again = client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "ttft_ms": 120, "tpot_ms": 20,
                                              "usage": {"prompt_tokens": 12, "completion_tokens": 40},
                                              "quality": {"user_rating": 1.0}}).json()["acks"][0]
    assert again["status"] == "duplicate" and again["settlement"]["replayed"] is True
    conflict = client.post("/v1/outcomes", json={"decision_id": d["decision_id"], "ttft_ms": 999})
    assert conflict.status_code == 409 and conflict.json()["acks"][0]["status"] == "conflict"


def test_outcome_batch_answers_one_ack_per_item(client):
    ids = [route(client)["decision_id"] for _ in range(3)]
    batch = [{"decision_id": ids[0], "usage": {"prompt_tokens": 5, "completion_tokens": 5}},
             {"decision_id": ids[1], "status": "error", "error": "upstream 500"},
             {"decision_id": "0" * 32},
             {"decision_id": ids[2], "shadow": True, "served_target": "frontier-large",
              "quality": {"judge_score": 0.5}}]
    r = client.post("/v1/outcomes", json=batch)
    assert r.status_code == 200
    acks = r.json()["acks"]
    assert [a["status"] for a in acks] == ["stored", "stored", "unknown_decision", "stored"]
    assert acks[1]["released"] is True and acks[1]["settlement"] is None
    assert acks[3]["settlement"] is None  # shadow outcomes never touch budgets
    assert r.json()["counts"] == {"stored": 3, "unknown_decision": 1}
    single_unknown = client.post("/v1/outcomes", json={"decision_id": "1" * 32})
    assert single_unknown.status_code == 404
    # each answered request is timed once (the batch once, the 404 too)
    assert "pointsman_outcome_latency_seconds_count 2.0" in client.get("/metrics").text


def test_outcome_batch_stores_valid_items_and_acks_invalid_ones(client, tmp_path):
    ids = [route(client)["decision_id"] for _ in range(2)]
    batch = [{"decision_id": ids[0], "usage": {"prompt_tokens": 5, "completion_tokens": 5}},
             {"decision_id": ids[1], "status": "bogus", "ttft_ms": -1},
             {"status": "ok"},
             {"decision_id": ids[1], "usage": {"prompt_tokens": 2**63}}]
    r = client.post("/v1/outcomes", json=batch)
    assert r.status_code == 200, r.text
    acks = r.json()["acks"]
    assert [a["status"] for a in acks] == ["stored", "invalid", "invalid", "invalid"]
    assert acks[0]["settlement"]["actual_cost_usd"] > 0
    assert acks[1]["decision_id"] == ids[1] and acks[1]["message"].startswith("[1].status: Input should be")
    assert "[1].ttft_ms: Input should be greater than or equal to 0" in acks[1]["message"]
    assert acks[2]["decision_id"] is None and acks[2]["outcome_id"] is None
    assert acks[2]["message"] == "[2].decision_id: Field required"
    assert acks[3]["message"].startswith("[3].usage.prompt_tokens: Input should be less than or equal to 100000000")
    assert r.json()["counts"] == {"stored": 1, "invalid": 3}
    with OutcomeLog(tmp_path / "outcomes.db") as log:
        assert len(log.decision(ids[0]).outcomes) == 1 and log.decision(ids[1]).outcomes == ()
    assert 'pointsman_outcomes_total{status="invalid"} 3.0' in client.get("/metrics").text


def test_outcome_without_status_is_stored_as_ok(client, tmp_path):
    d = route(client)
    assert client.post("/v1/outcomes", json={"decision_id": d["decision_id"]}).status_code == 200
    with OutcomeLog(tmp_path / "outcomes.db") as log:
        assert log.decision(d["decision_id"]).outcomes[0].status == "ok"


def test_usage_beyond_the_context_window_is_rejected_and_locks_nobody_out(tmp_path):
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:acme', window: day, limit_usd: 1.0}\n", encoding="utf-8")
    app, _ = make_app(tmp_path, budgets_path=budgets)
    acme = {"json": {"messages": [USER], "routing": {"tenant": "acme"}}}
    with TestClient(app) as c:
        d = c.post("/v1/route", **acme).json()
        window = c.app.state.fleet_state.fleet.targets[d["target"]].context_window_tokens
        r = c.post("/v1/outcomes", json={"decision_id": d["decision_id"],
                                         "usage": {"prompt_tokens": 10, "completion_tokens": 10**7}})
        assert r.status_code == 422 and r.json()["error"]["param"] == "usage.completion_tokens", r.text
        assert "context window is" in r.json()["error"]["message"]
        half = window * 6 // 10  # each fits, the sum does not
        r = c.post("/v1/outcomes", json=[{"decision_id": d["decision_id"],
                                          "usage": {"prompt_tokens": half, "completion_tokens": half}}])
        ack = r.json()["acks"][0]
        assert r.status_code == 200 and ack["status"] == "invalid" and ack["message"].startswith("[0].usage: ")
        served = c.post("/v1/outcomes", json={"decision_id": d["decision_id"], "served_target": "frontier-large",
                                              "shadow": True, "outcome_id": d["decision_id"] + "-s",
                                              "usage": {"prompt_tokens": 10**7, "completion_tokens": 1}})
        assert served.status_code == 422 and served.json()["error"]["param"] == "usage.prompt_tokens"
        assert c.post("/v1/route", **acme).status_code == 200  # nothing was booked
        # within the tolerance (x1.1, tokenizers differ): stored and settled
        r = c.post("/v1/outcomes", json={"decision_id": d["decision_id"],
                                         "usage": {"prompt_tokens": window, "completion_tokens": window // 20}})
        assert r.status_code == 200 and r.json()["acks"][0]["status"] == "stored", r.text


@pytest.mark.parametrize("body,param,message", [
    ({}, "decision_id", "Field required"),
    ({"decision_id": "x" * 32, "usage": {"prompt_tokens": -1}}, "usage.prompt_tokens", "Input should be greater"),
    ({"decision_id": "x" * 32, "colour": "red"}, "colour", "unknown field"),
    ({"decision_id": "x" * 32, "usage": {"prompt_tokens": 2**63, "completion_tokens": 1}}, "usage.prompt_tokens",
     "Input should be less than or equal to 100000000"),
    ({"decision_id": "x" * 32, "usage": {"prompt_tokens": 2**62, "completion_tokens": 2**62}}, "usage.prompt_tokens",
     "Input should be less than or equal to 100000000"),
    ({"decision_id": "x" * 32, "e2e_latency_ms": 1e300}, "e2e_latency_ms", "Input should be less than or equal"),
    ({"decision_id": "x" * 32, "quality": {"judge_score": -1e300}}, "quality.judge_score",
     "Input should be greater than or equal"),
    ({"decision_id": "x" * 32, "status": "bogus"}, "status", "Input should be"),
    ([{"decision_id": "x" * 32}, 7], "[1]", "expected a JSON object"),
    ([], None, "the outcome list is empty"),
    ("hello", None, "expected a JSON object"),
], ids=["missing-id", "negative-tokens", "unknown-field", "tokens-2**63", "tokens-2**62-each", "huge-latency",
        "huge-judge-score", "single-bad-status", "batch-non-object-item", "empty-list", "string"])
def test_bad_outcomes_are_422_naming_the_field(client, body, param, message):
    r = client.post("/v1/outcomes", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(message), err


def test_empty_and_malformed_bodies_are_400_on_every_post(client):
    for path in ("/v1/outcomes", "/v1/telemetry", "/v1/policy/validate"):
        assert client.post(path, content=b"").json()["error"]["code"] == "empty_body"
        r = client.post(path, content=b"{\"a\": ", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "malformed_json"


def test_every_post_enforces_the_body_limit(tmp_path):
    app, _ = make_app(tmp_path, max_body_bytes=200)
    with TestClient(app) as c:
        for path, body in (("/v1/outcomes", [{"decision_id": "0" * 32}] * 20),
                           ("/v1/telemetry", [{"endpoint": "llama-8b-0", "healthy": True}] * 20),
                           ("/v1/policy/validate", {"policy": "x" * 300})):
            r = c.post(path, json=body)
            assert r.status_code == 413, r.text
            err = r.json()["error"]
            assert err["param"] == "max_body_bytes" and "the limit is 200 bytes" in err["message"]


def test_telemetry_shows_in_fleet_and_metrics(client):
    fleet = client.app.state.fleet_state.fleet
    eid = next(e for e, info in fleet.endpoints.items() if info.target == "onprem-70b" and info.role == "prefill")
    r = client.post("/v1/telemetry", json=[{"endpoint": eid, "load": {"num_requests_waiting": 7,
                                                                       "prefill_utilization": 0.9}},
                                           {"endpoint": eid, "healthy": True}])
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 2 and r.json()["endpoints"][0]["load"]["num_requests_waiting"] == 7
    status = client.get("/v1/fleet").json()
    ep = next(e for e in status["targets"]["onprem-70b"]["endpoints"] if e["id"] == eid)
    assert ep["load"]["num_requests_waiting"] == 7 and ep["load"]["age_s"] >= 0
    metrics = client.get("/metrics").text
    assert 'pointsman_pool_prefill_utilization{pool="prefill",target="onprem-70b"} 0.9' in metrics
    assert "pointsman_load_signal_age_seconds{" in metrics
    assert "pointsman_pool_decode_utilization{" not in metrics  # nobody reported decode utilization


@pytest.mark.parametrize("body,param,message", [
    ({"endpoint": "llama-8b-O", "load": {"num_requests_waiting": 1}}, "endpoint", "unknown endpoint 'llama-8b-O' (did you mean 'llama-8b-"),
    ({"endpoint": "llama-8b-0", "load": {"num_requests_waitin": 1}}, "load.num_requests_waitin", "unknown field"),
    ({"endpoint": "llama-8b-0", "load": {"kv_cache_usage": "full"}}, "load.kv_cache_usage", "must be a number"),
    ([{"endpoint": "llama-8b-0", "healthy": True}, {"endpoint": "llama-8b-0"}], "[1]", "a report needs"),
    ({"endpoint": "llama-8b-0", "load": {}}, "load", "the load snapshot is empty"),
], ids=["did-you-mean", "unknown-load-field", "wrong-type", "batch-index", "empty-load"])
def test_bad_telemetry_is_422_naming_the_field(client, body, param, message):
    r = client.post("/v1/telemetry", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(message), err


def test_fleet_has_effective_prices_after_outcomes(client):
    d = route(client)
    client.post("/v1/outcomes", json={"decision_id": d["decision_id"],
                                      "usage": {"prompt_tokens": 100, "completion_tokens": 100}})
    price = client.get("/v1/fleet").json()["targets"][d["target"]]["effective_price"]
    assert price["completion_tokens"] == 100 and price["usd_per_token"] > 0
    assert f'pointsman_effective_price_usd_per_token{{target="{d["target"]}"}}' in client.get("/metrics").text


def test_policy_read_and_validate(client):
    p = client.get("/v1/policy").json()
    assert p["name"] == "static" and p["rules"][0]["name"] == "estimator-unavailable"
    assert p["source"].startswith("# The static routing policy")
    ok = client.post("/v1/policy/validate", json={"policy": p["source"]}).json()
    assert ok["valid"] is True and ok["revision"] == p["revision"]
    bad_text = p["source"].replace("difficulty.p_hard >= variables.p_hard_frontier", "difficulty.p_hardd >= 1")
    bad = client.post("/v1/policy/validate", json={"policy": bad_text, "file": "mine.yaml"}).json()
    assert bad["valid"] is False
    assert any(x["file"] == "mine.yaml" and x["line"] > 1 and "p_hardd" in x["message"] for x in bad["problems"])
    control = client.post("/v1/policy/validate", json={"policy": "rules:\n  - \b"}).json()  # found by schemathesis
    assert control["valid"] is False and control["problems"][0]["text"].startswith("<request>:2:5: yaml-syntax")
    r = client.post("/v1/policy/validate", json={"policy": 5})
    assert r.status_code == 422 and r.json()["error"]["param"] == "policy"


def test_reload_endpoint_swaps_a_good_file_and_rejects_a_bad_one(tmp_path):
    app, policy_path = make_app(tmp_path)
    with TestClient(app) as c:
        before = route(c)["policy_revision"]
        text = policy_path.read_text()
        policy_path.write_text(text.replace("p_hard_frontier: 0.67", "p_hard_frontier: 0.10"))
        r = c.post("/v1/policy/reload")
        assert r.status_code == 200 and r.json()["changed"] is True
        d = route(c)
        assert d["policy_revision"] == r.json()["revision"] != before
        assert d["target"] == "frontier-large"  # p_hard 0.2 is now above the frontier threshold
        policy_path.write_text(text.replace("route: {target: frontier-large", "route: {target: frontier-larg"))
        bad = c.post("/v1/policy/reload")
        assert bad.status_code == 422 and bad.json()["ok"] is False
        problem = bad.json()["problems"][0]
        assert problem["file"] == str(policy_path) and problem["line"] > 1 and "frontier-larg" in problem["message"]
        assert route(c)["policy_revision"] == d["policy_revision"]  # the running policy keeps serving
        served = c.get("/v1/policy").json()
        assert served["last_reload"]["ok"] is False
        # its text is the serving policy's (before: the file re-read, i.e. the rejected text)
        assert served["source"] == text.replace("p_hard_frontier: 0.67", "p_hard_frontier: 0.10")
        assert hashlib.sha256(served["source"].encode()).hexdigest()[:16] == served["revision"]
        assert 'pointsman_policy_reloads_total{result="rejected",source="endpoint"} 1.0' in c.get("/metrics").text


def test_reload_rejects_a_rule_with_an_invalid_route_naming_every_problem_of_it(tmp_path):
    """A misspelt ``mode`` hid the problems of the same rule's ``when``: the 422 now lists them all, located,
    and the running policy keeps serving."""
    app, policy_path = make_app(tmp_path)
    with TestClient(app) as c:
        before = route(c)["policy_revision"]
        policy_path.write_text(policy_path.read_text().replace(
            "request.prompt_tokens >= variables.long_prompt_tokens &&\n      cache.prefix_hit_ratio",
            'difficulty.p_hardd >= variables.long_prompt_tokens && predict["onprem-7b"].meets_slo &&\n'
            "      cache.prefix_hit_ratio").replace("mode: disaggregated, fallbacks", "mode: disagregated, fallbacks"))
        bad = c.post("/v1/policy/reload")
        assert bad.status_code == 422 and bad.json()["ok"] is False
        assert [(p["file"], p["line"], p["col"], p["code"]) for p in bad.json()["problems"]] == [
            (str(policy_path), 49, 18, "unknown-signal"), (str(policy_path), 49, 69, "unknown-target"),
            (str(policy_path), 51, 39, "invalid-value")]
        assert route(c)["policy_revision"] == before


ALIAS_BOMB = ("apiVersion: pointsman/v1\nkind: RoutingPolicy\nvariables:\n  l0: &l0 [lol]\n"
              + "".join(f"  l{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * 9) + "]\n" for k in range(1, 9))
              + "rules:\n  - name: default\n    route: {target: onprem-8b}\n")


def test_an_alias_bomb_is_rejected_by_validate_and_reload_and_the_policy_keeps_serving(tmp_path):
    app, policy_path = make_app(tmp_path)
    with TestClient(app) as c:
        before = route(c)["policy_revision"]
        v = c.post("/v1/policy/validate", json={"policy": ALIAS_BOMB, "file": "bomb.yaml"})
        assert v.status_code == 200 and v.json()["valid"] is False
        [problem] = v.json()["problems"]
        assert (problem["file"], problem["line"], problem["code"]) == ("bomb.yaml", 9, "too-large")
        policy_path.write_text(ALIAS_BOMB)
        bad = c.post("/v1/policy/reload")
        assert bad.status_code == 422 and bad.json()["ok"] is False
        assert [(p["file"], p["code"]) for p in bad.json()["problems"]] == [(str(policy_path), "too-large")]
        assert route(c)["policy_revision"] == before  # the running policy keeps serving
        assert c.get("/v1/policy").json()["last_reload"]["ok"] is False


def test_file_watch_reloads_the_policy(tmp_path):
    app, policy_path = make_app(tmp_path)
    app.state.settings.watch_policy = True
    with TestClient(app) as c:
        assert c.get("/v1/policy").json()["watching"] is True
        before = route(c)["policy_revision"]
        time.sleep(0.3)  # let the watcher start
        policy_path.write_text(policy_path.read_text().replace("p_hard_frontier: 0.67", "p_hard_frontier: 0.11"))
        deadline = time.monotonic() + 20
        while route(c)["policy_revision"] == before:
            assert time.monotonic() < deadline, "the watcher did not reload the policy within 20 s"
            time.sleep(0.1)
        assert c.get("/v1/policy").json()["last_reload"]["source"] == "watch"


class SlowEstimator:
    """An estimator that hangs for 2 s (a stuck model)."""

    version = "slow-1"
    tokenizer = None

    def estimate(self, features):
        time.sleep(2.0)
        return DifficultyEstimate(0.9, True, 2000.0, None)


def test_estimator_overrun_decides_through_the_unavailable_rule(tmp_path):
    app, _ = make_app(tmp_path, SlowEstimator(), estimator_timeout_ms=50)
    with TestClient(app) as c:
        d = c.post("/v1/route", json={"messages": [USER], "routing": {"explain": True}}).json()
        assert d["rule"] == "estimator-unavailable" and d["estimator_version"] == "slow-1"
        assert d["trace"]["estimator"]["error"].startswith("timeout: no estimate within the 50 ms budget")
        assert 'pointsman_estimator_unavailable_total{reason="timeout"} 1.0' in c.get("/metrics").text


def test_probes_and_metrics(client):
    route(client)
    assert client.get("/healthz").json()["auth"] is False
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["decision_log"] == "ok"
    assert client.get("/docs").status_code == 200 and "/v1/outcomes" in client.get("/openapi.json").json()["paths"]
    m = client.get("/metrics")
    assert m.headers["content-type"].startswith("text/plain")
    for name in ("pointsman_decisions_total{rule=\"default\",target=\"onprem-8b\"} 1.0",
                 "pointsman_decision_latency_seconds_bucket", "pointsman_estimator_latency_seconds_bucket",
                 "pointsman_p_hard_bucket", "pointsman_budget_reserved_usd_total", "pointsman_serving_info{"):
        assert name in m.text, name


def test_prompts_are_not_stored_unless_opted_in(tmp_path):
    for opt_in in (False, True):
        folder = tmp_path / str(opt_in)
        folder.mkdir()
        app, _ = make_app(folder, store_prompts=opt_in)
        with TestClient(app) as c:
            d = route(c)
            c.post("/v1/outcomes", json={"decision_id": d["decision_id"]})  # flushes the decision log
        with OutcomeLog(folder / "outcomes.db") as log:
            logged = log.decision(d["decision_id"])
        assert logged.prompt_sha256 and logged.request_features["prompt_tokens"] > 0
        assert (logged.prompt_text == "What is the capital of France?") is opt_in
        raw = (folder / "outcomes.db").read_bytes() + b"".join(p.read_bytes() for p in folder.glob("outcomes.db-*"))
        assert (b"capital of France" in raw) is opt_in


def test_an_outcome_is_stored_after_its_decision_and_waits_for_no_other(tmp_path):
    """The decision log writer holds decisions up to ``decision_log_flush_ms`` (here a minute): an outcome
    commits its own decision first (the outcome's fsync covers the row, and the two join in the log), but a
    repeated outcome of a decision already committed leaves the decisions answered since in memory."""
    app, _ = make_app(tmp_path, decision_log_flush_ms=60_000)
    with TestClient(app) as c:
        first = route(c)
        r = c.post("/v1/outcomes", json={"decision_id": first["decision_id"], "outcome_id": "o1"})
        assert r.status_code == 200 and r.json()["acks"][0]["status"] == "stored"
        with OutcomeLog(tmp_path / "outcomes.db") as log:
            joined = list(log.joined(decision_ids=[first["decision_id"]]))
            assert [o.outcome_id for d in joined for o in d.outcomes] == ["o1"]
        later = route(c)
        r = c.post("/v1/outcomes", json={"decision_id": first["decision_id"], "outcome_id": "o1"})
        assert r.json()["acks"][0]["status"] == "duplicate"
        assert app.state.runtime.writer.pending == 1  # the later decision was not committed for it
        with OutcomeLog(tmp_path / "outcomes.db") as log:
            assert log.decision(later["decision_id"]) is None


# -- auth -----------------------------------------------------------------------------------

ENDPOINTS = [("post", "/v1/route", {"messages": [USER]}, "gateway"),
             ("post", "/v1/outcomes", {"decision_id": "0" * 32}, "gateway"),
             ("post", "/v1/telemetry", {"endpoint": "llama-8b-0", "healthy": True}, "telemetry"),
             ("get", "/v1/fleet", None, "admin"),
             ("get", "/v1/policy", None, "admin"),
             ("post", "/v1/policy/validate", {"policy": "kind: RoutingPolicy"}, "admin"),
             ("post", "/v1/policy/reload", None, "admin"),
             ("get", "/healthz", None, "open"),
             ("get", "/readyz", None, "open"),
             ("get", "/metrics", None, "open")]


@pytest.fixture(scope="module")
def auth_client(tmp_path_factory):
    app, _ = make_app(tmp_path_factory.mktemp("auth"), gateway_api_keys=f"edge={GATEWAY}",
                      admin_api_keys=f"ops={ADMIN}", telemetry_api_keys=f"sidecar={TELEMETRY}")
    with TestClient(app) as c:
        yield c


@pytest.mark.parametrize("key", [None, "wrong-key-123", GATEWAY, ADMIN, TELEMETRY],
                         ids=["none", "wrong", "gateway", "admin", "telemetry"])
@pytest.mark.parametrize("method,path,body,role", ENDPOINTS, ids=[e[1] for e in ENDPOINTS])
def test_auth_matrix(auth_client, method, path, body, role, key):
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    r = auth_client.request(method.upper(), path, json=body, headers=headers)
    if role == "open":
        expected = 200
    elif key in (None, "wrong-key-123"):
        expected = 401
    elif (role, key) in (("admin", GATEWAY), ("admin", TELEMETRY), ("gateway", TELEMETRY), ("telemetry", GATEWAY)):
        expected = 403
    else:
        expected = None  # admitted: whatever the endpoint answers, but not an auth error
    if expected is None:
        assert r.status_code not in (401, 403), r.text
    else:
        assert r.status_code == expected, r.text
    if r.status_code == 401:
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == ("missing_api_key" if key is None else "invalid_api_key")
    if r.status_code == 403:
        name, held = ("edge", "gateway") if key == GATEWAY else ("sidecar", "telemetry")
        assert f"key '{name}' has the {held} role" in r.json()["error"]["message"]
    assert GATEWAY not in r.text and ADMIN not in r.text and TELEMETRY not in r.text


def test_a_gateway_key_cannot_mark_the_fleet_unhealthy(auth_client):
    """Any gateway key could post ``healthy: false`` for every endpoint, and every route then answered
    no_eligible_target: health marks and load pushes move every tenant's routing, so they take a telemetry
    (engine sidecar) or admin key. Found by a security review."""
    fleet = auth_client.get("/v1/fleet", headers={"x-api-key": ADMIN}).json()
    endpoints = [ep["id"] for t in fleet["targets"].values() for ep in t["endpoints"]]
    down = [{"endpoint": e, "healthy": False, "reason": "drained"} for e in endpoints]
    r = auth_client.post("/v1/telemetry", json=down, headers={"x-api-key": GATEWAY})
    assert r.status_code == 403, r.text
    assert auth_client.post("/v1/route", json={"messages": [USER]}, headers={"x-api-key": GATEWAY}).status_code == 200
    try:
        r = auth_client.post("/v1/telemetry", json=down[:1], headers={"x-api-key": TELEMETRY})
        assert r.status_code == 200 and r.json()["endpoints"][0]["healthy"] is False, r.text
    finally:
        up = [{"endpoint": e, "healthy": True} for e in endpoints]
        assert auth_client.post("/v1/telemetry", json=up, headers={"x-api-key": ADMIN}).status_code == 200


def test_auth_accepts_x_api_key_and_health_says_auth_is_on(auth_client):
    assert auth_client.get("/v1/policy", headers={"x-api-key": ADMIN}).status_code == 200
    assert auth_client.get("/healthz").json()["auth"] is True


def test_bad_key_settings_are_rejected_without_echoing_the_secret(tmp_path):
    with pytest.raises(ValueError, match="POINTSMAN_ADMIN_API_KEYS: entry 1 .*at least 8") as exc:
        make_app(tmp_path, admin_api_keys="ops=short")
    assert "short" not in str(exc.value).replace("at least", "")
    with pytest.raises(ValueError, match="configured twice"):
        make_app(tmp_path, gateway_api_keys="a=same-secret-1", admin_api_keys="b=same-secret-1")


def test_a_failed_or_timed_out_answer_that_had_started_books_its_estimate(client):
    """An error or timeout after the first token (``ttft_ms``) ran and is billed by the upstream: without
    usage it books the decision's estimate, as a cancelled stream that had started does; one that never
    started releases its hold (found by a fresh-eyes tester: they released it, so a client could spend
    nothing by reporting each answer as failed mid-stream)."""
    ids = [route(client)["decision_id"] for _ in range(4)]
    batch = [{"decision_id": ids[0], "status": "error", "error": "upstream 500 mid-stream", "ttft_ms": 120.0},
             {"decision_id": ids[1], "status": "timeout", "ttft_ms": 95.0},
             {"decision_id": ids[2], "status": "error", "error": "upstream 500"},
             {"decision_id": ids[3], "status": "timeout"}]
    acks = client.post("/v1/outcomes", json=batch).json()["acks"]
    for ack in acks[:2]:
        assert ack["settlement"] is not None and ack["settlement"]["actual_cost_usd"] > 0, ack
        assert ack["released"] is False, ack
    for ack in acks[2:]:
        assert ack["released"] is True and ack["settlement"] is None, ack


def test_a_shadow_outcome_without_its_own_id_leaves_the_decision_to_its_real_outcome(client):
    """A shadow answer (evaluation only) reported first, without an ``outcome_id``, took the decision
    id as its key: the real outcome was then a 409 conflict, stored nowhere and never settled (its
    spend unbooked, its hold kept to the TTL). A shadow's default key is now its own, one per target."""
    d = route(client)
    shadow = {"decision_id": d["decision_id"], "shadow": True, "served_target": "frontier-large",
              "usage": {"prompt_tokens": 12, "completion_tokens": 30}, "quality": {"judge_score": 0.7}}
    first = client.post("/v1/outcomes", json=shadow).json()["acks"][0]
    assert first["status"] == "stored" and first["settlement"] is None
    real = client.post("/v1/outcomes", json={"decision_id": d["decision_id"],
                                             "usage": {"prompt_tokens": 12, "completion_tokens": 40}})
    ack = real.json()["acks"][0]
    assert real.status_code == 200 and ack["status"] == "stored", real.text
    assert ack["settlement"]["replayed"] is False and ack["settlement"]["actual_cost_usd"] > 0
    again = client.post("/v1/outcomes", json=shadow).json()["acks"][0]
    assert again["status"] == "duplicate"
    other = client.post("/v1/outcomes", json={**shadow, "served_target": "frontier-small"}).json()["acks"][0]
    assert other["status"] == "stored"


def test_a_shadow_outcome_without_its_target_is_refused_alone(tmp_path, serve):
    """A shadow outcome without ``served_target`` was stored as the decided target's answer (the log's
    served_target defaults to the decision's), so the labels read another model's answer as that
    target's. Through ``pointsman serve``: refused naming ``served_target`` (an ``invalid`` ack in a
    batch, whose other outcomes are stored; a 422 alone), never stored."""
    import httpx

    _, base = serve(tmp_path, scrape_interval_s="0")
    r = httpx.post(f"{base}/v1/route", json={"messages": [USER]}, timeout=30)
    assert r.status_code == 200, r.text
    d = r.json()
    judged = {"quality": {"judge_score": 0.2, "judge": "j"}}
    batch = [{"decision_id": d["decision_id"], "shadow": True, **judged},
             {"decision_id": d["decision_id"], "usage": {"prompt_tokens": 12, "completion_tokens": 40}},
             {"decision_id": d["decision_id"], "shadow": True, "served_target": "frontier-large", **judged}]
    r = httpx.post(f"{base}/v1/outcomes", json=batch, timeout=30)
    assert r.status_code == 200, r.text
    acks = r.json()["acks"]
    assert [a["status"] for a in acks] == ["invalid", "stored", "stored"], acks
    assert acks[0]["message"].startswith("[0].served_target: required with shadow true"), acks[0]
    alone = httpx.post(f"{base}/v1/outcomes", json=batch[0], timeout=30)
    assert alone.status_code == 422 and alone.json()["error"]["param"] == "served_target", alone.text
    with OutcomeLog(tmp_path / "outcomes.db") as log:
        logged = log.decision(d["decision_id"])
        assert logged is not None
        assert sorted((o.served_target, o.shadow) for o in logged.outcomes) == sorted([
            (d["target"], False), ("frontier-large", True)])


def test_a_stale_utilization_leaves_the_pool_gauges(tmp_path):
    """A pool's utilization gauge kept the last reading pushed half an hour before, while routing and pricing had
    dropped it as stale (the policy's signals.load max_age_s): a dashboard showed a busy pool that nothing reads
    (found by a tester). Past max_age_s the reading leaves the gauges; its age stays exported."""
    import time

    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(STATIC_POLICY_PATH.read_text() + "\nsignals:\n  load: {max_age_s: 0.3}\n")
    app, _ = make_app(tmp_path)
    with TestClient(app) as client:
        r = client.post("/v1/telemetry", json=[{"endpoint": "llama-70b-prefill-0", "load": {"prefill_utilization": 0.9}}])
        assert r.status_code == 200, r.text
        gauge = 'pointsman_pool_prefill_utilization{pool="prefill",target="onprem-70b"} 0.9'
        assert gauge in client.get("/metrics").text
        time.sleep(0.5)
        metrics = client.get("/metrics").text
        assert "pointsman_pool_prefill_utilization{" not in metrics  # before: 0.9 until another reading came
        assert 'pointsman_load_signal_age_seconds{endpoint="llama-70b-prefill-0"' in metrics
