"""Policy reload and model swap while clients send decisions: no decision fails, each names the
policy revision and estimator version it ran on, and every decision that started after a
change names the new one. The model swap goes through ``ModelFollower.poll_once`` (the path
the registry poller takes) with an injected resolver; ``test_loop_http.py`` follows a real
MLflow alias."""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass

from fastapi.testclient import TestClient

from pointsman.estimator.estimate import DifficultyEstimate
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.service.app import create_app
from pointsman.service.model_follower import ModelFollower
from pointsman.service.settings import Settings


@dataclass
class RegistryModel:
    """A fixed-difficulty stand-in for registry version ``n`` (``source`` as the loader names it)."""

    p_hard: float
    n: int
    tokenizer: None = None

    @property
    def version(self) -> str:
        return f"difficulty-v{self.n}"

    @property
    def source(self) -> str:
        return f"models:/pointsman-difficulty/{self.n} (@champion)"

    def estimate(self, features: object) -> DifficultyEstimate:
        return DifficultyEstimate(self.p_hard, True, 0.01, None)


def test_policy_reload_and_model_swap_under_traffic_drop_nothing(tmp_path):
    policy_path = tmp_path / "policy.yaml"
    shutil.copy(STATIC_POLICY_PATH, policy_path)
    fleet = load_fleet()
    engine = RoutingEngine(fleet, load_policy(policy_path, fleet), RegistryModel(0.2, 1))
    app = create_app(Settings(data_dir=tmp_path, policy_path=policy_path, watch_policy=False, estimator_timeout_ms=500),
                     engine=engine, owns_engine=True)
    results: list[tuple[float, int, str | None, str | None]] = []  # (start, status, policy_revision, estimator)
    stop = threading.Event()

    def client_loop(c: TestClient, worker: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            started = time.monotonic()
            r = c.post("/v1/route", json={"messages": [{"role": "user", "content": f"q {worker}-{n}"}]})
            body = r.json() if r.status_code == 200 else {}
            results.append((started, r.status_code, body.get("policy_revision"), body.get("estimator_version")))

    with TestClient(app) as c:
        rt = app.state.runtime
        old_revision = rt.live.engine.policy.revision
        threads = [threading.Thread(target=client_loop, args=(c, w)) for w in range(4)]
        for t in threads:
            t.start()
        try:
            def wait_for(count: int) -> None:
                deadline = time.monotonic() + 30
                while len(results) < count:
                    assert time.monotonic() < deadline
                    time.sleep(0.005)

            wait_for(40)
            # 1. the policy file changes and the reload endpoint serves it
            policy_path.write_text(policy_path.read_text().replace("p_hard_frontier: 0.67", "p_hard_frontier: 0.15"))
            reload = c.post("/v1/policy/reload").json()
            assert reload["ok"] and reload["changed"]
            reloaded_at = time.monotonic()
            wait_for(len(results) + 40)
            # 2. the followed alias moves to version 2: loaded aside, swapped in atomically
            follower = ModelFollower(rt.live, "champion", load=lambda spec: (RegistryModel(0.9, 2), None),
                                     wrap=rt.wrap, resolve=lambda spec: "2", on_result=rt.record_swap)
            assert follower.current == "1"
            swap = follower.poll_once()
            swapped_at = time.monotonic()
            assert swap.ok and (swap.previous_version, swap.version) == ("difficulty-v1", "difficulty-v2")
            assert follower.poll_once() is None  # the alias did not move again
            wait_for(len(results) + 40)
            # 3. a broken file written while traffic flows is rejected; decisions go on
            policy_path.write_text("rules: [")
            assert c.post("/v1/policy/reload").status_code == 422
            wait_for(len(results) + 40)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
        health = c.get("/healthz").json()
        metrics = c.get("/metrics").text

    assert all(status == 200 for _, status, _, _ in results), {s for _, s, _, _ in results}
    assert len(results) >= 160
    new_revision = reload["revision"]
    assert {rev for _, _, rev, _ in results} == {old_revision, new_revision}
    assert all(rev == new_revision for started, _, rev, _ in results if started > reloaded_at)
    assert all(v == "difficulty-v2" for started, _, _, v in results if started > swapped_at)
    assert any(v == "difficulty-v1" for *_, v in results)
    assert health["estimator"]["version"] == "difficulty-v2" and health["policy_revision"] == new_revision
    assert 'pointsman_model_swaps_total{result="ok"} 1.0' in metrics


def test_a_fleet_reload_that_leaves_rules_out_says_so(tmp_path, caplog):
    """A rule with ``if_fleet_has`` is left out on a fleet without its target instead of failing the load, so
    a fleet edit that drops (or misspells) onprem-8b turned the default policy's two 8B rules off while the
    service logged nothing (only ``pointsman policy check`` named them); before ``if_fleet_has`` such a reload
    was refused. The service now logs each rule left out whenever a policy starts serving -- found by a
    fresh-eyes tester."""
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH
    from pointsman.policy.rules.compiler import DEFAULT_POLICY_PATH

    fleet_path = tmp_path / "fleet.yaml"
    text = DEFAULT_FLEET_PATH.read_text(encoding="utf-8")
    fleet_path.write_text(text, encoding="utf-8")
    settings = Settings(data_dir=tmp_path, fleet_path=fleet_path, policy_path=DEFAULT_POLICY_PATH, watch_policy=False,
                        watch_fleet=False)
    fleet = load_fleet(fleet_path)
    engine = RoutingEngine(fleet, load_policy(DEFAULT_POLICY_PATH, fleet), RegistryModel(0.2, 1))
    with TestClient(create_app(settings, engine=engine, owns_engine=True)) as c:
        assert not [r for r in caplog.records if "left out" in r.getMessage()]
        head, _, rest = text.partition("  onprem-8b:\n")
        fleet_path.write_text(head + "  onprem-70b:\n" + rest.partition("  onprem-70b:\n")[2], encoding="utf-8")
        r = c.post("/v1/fleet/reload")
        assert r.status_code == 200 and r.json()["changed"], r.text
        rules = [x["name"] for x in c.get("/v1/policy").json()["rules"]]
    assert "onprem-8b-first" not in rules and "default" in rules
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "left out" in r.getMessage()]
    assert len(warned) == 2 and all("the fleet has no 'onprem-8b'" in w for w in warned), warned
    assert {w.split("'")[1] for w in warned} == {"onprem-8b-in-slo", "onprem-8b-first"}


def test_a_fleet_rejected_for_the_old_policy_serves_once_the_policy_that_takes_it_is_reloaded(tmp_path):
    """Removing a target takes two files: the fleet without it, the policy without its rules. A fleet that
    arrives first (two ConfigMaps swapped one after the other) is rejected, since the serving policy still
    routes there; the policy then compiled against the serving fleet and was swapped in, and the fleet file
    on disk was never read again: the service kept routing to the removed target (GET /healthz named the
    old fleet revision) while both files on disk agreed. The other order worked: a fleet reload recompiles
    the policy file. Now a policy reload that serves retries a fleet file that was rejected."""
    fleet_path, policy_path, text, rules = _packaged_pair(tmp_path)
    with _app_on(tmp_path, fleet_path, policy_path) as c:
        fleet_path.write_text(text.partition("  frontier-large:\n")[0], encoding="utf-8")
        assert c.post("/v1/fleet/reload").status_code == 422
        policy_path.write_text(rules % "frontier-small", encoding="utf-8")
        assert c.post("/v1/policy/reload").status_code == 200
        health = c.get("/healthz").json()
        targets = set(c.get("/v1/fleet").json()["targets"])
        d = c.post("/v1/route", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert health["fleet_revision"] == load_fleet(fleet_path).revision
    assert targets == {"onprem-8b", "onprem-70b", "frontier-small"}
    assert (d["target"], d["fleet_revision"]) == ("frontier-small", health["fleet_revision"])


def test_a_policy_a_fleet_reload_starts_serving_is_its_last_reload(tmp_path):
    """Adding a target: the policy routing to it is rejected until the fleet has it; the fleet reload then
    recompiles the policy file and serves it. GET /v1/policy named the new revision, and beside it
    `last_reload` still said the reload was rejected (unknown target): the serving policy reported as
    refused. The fleet reload that swaps a policy in is now its last reload (source `fleet`)."""
    fleet_path, policy_path, text, rules = _packaged_pair(tmp_path)
    with _app_on(tmp_path, fleet_path, policy_path) as c:
        policy_path.write_text(rules % "frontier-xl", encoding="utf-8")
        assert c.post("/v1/policy/reload").status_code == 422
        large = text[text.index("  frontier-large:\n"):]
        fleet_path.write_text(text + large.replace("  frontier-large:", "  frontier-xl:", 1), encoding="utf-8")
        assert c.post("/v1/fleet/reload").status_code == 200
        p = c.get("/v1/policy").json()
        d = c.post("/v1/route", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert d["target"] == "frontier-xl" and p["revision"] == d["policy_revision"]
    assert (p["last_reload"]["ok"], p["last_reload"]["revision"], p["last_reload"]["source"]) == (True, p["revision"], "fleet")


def test_a_renamed_target_serves_once_both_files_have_the_new_name(tmp_path):
    """Renaming a target in both files: the fleet with the new name is rejected (the serving policy routes to
    the old one), then the policy with the new name is rejected too (the serving fleet lacks it), and nothing
    read either file again: both agreed on disk, the service kept the old pair. A policy reload rejected while
    the last fleet reload was also rejected now tries the two files together."""
    fleet_path, policy_path, text, rules = _packaged_pair(tmp_path)
    with _app_on(tmp_path, fleet_path, policy_path) as c:
        fleet_path.write_text(text.replace("  frontier-large:", "  frontier-xl:", 1), encoding="utf-8")
        assert c.post("/v1/fleet/reload").status_code == 422
        policy_path.write_text(rules % "frontier-xl", encoding="utf-8")
        r = c.post("/v1/policy/reload")
        d = c.post("/v1/route", json={"messages": [{"role": "user", "content": "hi"}]}).json()
        p = c.get("/v1/policy").json()
    assert d["target"] == "frontier-xl" and d["fleet_revision"] == load_fleet(fleet_path).revision
    assert r.status_code == 200 and r.json()["ok"] and p["last_reload"]["ok"], (r.text, p["last_reload"])


#: A policy routing hard requests to one target (``%s``) and the rest to onprem-8b.
_RULES = ("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
          "  - name: hard\n    when: difficulty.p_hard >= 0.1\n    route: {target: %s}\n"
          "  - name: default\n    route: {target: onprem-8b}\n")


def _packaged_pair(tmp_path):
    """The packaged fleet and a ``_RULES`` policy on frontier-large, written in ``tmp_path``: (fleet path, policy
    path, the fleet's text, ``_RULES``)."""
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH

    fleet_path, policy_path = tmp_path / "fleet.yaml", tmp_path / "policy.yaml"
    text = DEFAULT_FLEET_PATH.read_text(encoding="utf-8")
    fleet_path.write_text(text, encoding="utf-8")
    policy_path.write_text(_RULES % "frontier-large", encoding="utf-8")
    return fleet_path, policy_path, text, _RULES


def _app_on(tmp_path, fleet_path, policy_path) -> TestClient:
    """A client of the app serving the two files (no watchers: reloads by POST)."""
    settings = Settings(data_dir=tmp_path, fleet_path=fleet_path, policy_path=policy_path, watch_policy=False,
                        watch_fleet=False)
    fleet = load_fleet(fleet_path)
    engine = RoutingEngine(fleet, load_policy(policy_path, fleet), RegistryModel(0.2, 1))
    return TestClient(create_app(settings, engine=engine, owns_engine=True))
