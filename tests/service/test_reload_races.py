"""A fleet reload racing a model swap: both changes land.

A fleet reload reads the serving engine, compiles the policy against the new fleet and swaps a whole
new engine in. Before, it did not hold ``LiveEngine``'s lock while doing so: a model the follower
swapped in during a fleet reload was replaced by the old estimator when the reload finished, and the
follower, which thought it served the new version (``/healthz`` ``model_follow.serving``), never
swapped again: decisions named the old version until the alias moved again. The interleaving is forced
through the real ``reload_fleet`` and ``ModelFollower.poll_once``: the reload's compile waits (at most
2 s) until the swap has landed.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
from pointsman.policy.rules import compiler
from pointsman.request import request_from_prompt
from pointsman.service import fleet_reload
from pointsman.service.fleet_reload import reload_fleet
from pointsman.service.live_engine import LiveEngine
from pointsman.service.model_follower import ModelFollower
from tests.service.test_live_changes import RegistryModel

POLICY = """apiVersion: pointsman/v1
kind: RoutingPolicy
metadata: {{name: races}}
rules:
  - name: small
    if_fleet_has: [onprem-8b]
    when: difficulty.p_hard < {threshold}
    route: {{target: onprem-8b}}
  - name: big
    route: {{target: onprem-70b}}
"""


def _without_8b(text: str) -> str:
    head, _, rest = text.partition("  onprem-8b:\n")
    return head + "  onprem-70b:\n" + rest.partition("  onprem-70b:\n")[2]


def _live(tmp_path: Path) -> tuple[LiveEngine, Path, Path]:
    fleet_path, policy_path = tmp_path / "fleet.yaml", tmp_path / "policy.yaml"
    fleet_path.write_text(DEFAULT_FLEET_PATH.read_text())
    policy_path.write_text(POLICY.format(threshold=0.5))
    fleet = load_fleet(fleet_path)
    return LiveEngine(RoutingEngine(fleet, compiler.load_policy(policy_path, fleet), RegistryModel(0.2, 1))), \
        fleet_path, policy_path


def _held_until(module, landed: threading.Event, monkeypatch) -> threading.Event:
    """Make ``module.load_policy`` wait (2 s at most) until ``landed`` is set; returns the event set when
    it starts waiting."""
    entered, real = threading.Event(), compiler.load_policy

    def held(*args, **kwargs):
        entered.set()
        landed.wait(2)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "load_policy", held)
    return entered


def _run(first, second, entered: threading.Event) -> None:
    a = threading.Thread(target=first)
    a.start()
    assert entered.wait(10)
    b = threading.Thread(target=second)
    b.start()
    a.join(30)
    b.join(30)
    assert not a.is_alive() and not b.is_alive()


def test_a_model_swapped_during_a_fleet_reload_stays_swapped(tmp_path, monkeypatch):
    live, fleet_path, _ = _live(tmp_path)
    swapped = threading.Event()
    entered = _held_until(fleet_reload, swapped, monkeypatch)
    follower = ModelFollower(live, "champion", load=lambda spec: (RegistryModel(0.9, 2), None),
                             resolve=lambda spec: "2", on_result=lambda result: swapped.set())
    fleet_path.write_text(_without_8b(fleet_path.read_text()))
    results = []
    _run(lambda: results.append(reload_fleet(live, fleet_path)), follower.poll_once, entered)
    assert results[0].changed, results
    engine = live.engine
    assert "onprem-8b" not in engine.fleet.targets  # the fleet reload landed
    assert engine.estimator.version == "difficulty-v2", engine.estimator.version  # and so did the swap
    assert live.follow.serving == "2"
    decision = engine.route(request_from_prompt("hello"), dispatch=False)
    assert decision.estimator_version == "difficulty-v2" and decision.p_hard == pytest.approx(0.9)
