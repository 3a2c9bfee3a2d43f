"""The ``budget`` filter refuses a target only when it cannot fit wherever it could run: through the app, with a
real SQLite ledger, a short prompt on a target whose aggregated pool is priced far above its decode pool, with its
aggregated endpoint marked unhealthy (``/v1/telemetry``), prefills on a decode endpoint (``short_prompts_on_decode``).
A budget between the two prices fits that hold; the filter used to price the aggregated pool (the default mode),
excluded the target and fell back (the Azure cascade replay's request 50, docs/cascade.md)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import load_policy
from pointsman.service.app import create_app
from pointsman.service.bootstrap import build_state
from pointsman.service.settings import Settings


def _pool(tokens_per_s: int, names: list[str]) -> str:
    eps = ", ".join(f'{{name: {n}, url: "http://{n}/v1"}}' for n in names)
    return (f"        gpus_per_replica: 1\n        prefill_tokens_per_s: {tokens_per_s}\n"
            f"        decode_tokens_per_s: {tokens_per_s}\n        endpoints: [{eps}]\n")


#: ``big``'s aggregated pool runs at 1/100 of its prefill and decode pools' throughput: 100x their price.
FLEET = ("apiVersion: pointsman/v1\nkind: Fleet\ntargets:\n"
         "  small:\n    kind: onprem\n    model: meta-llama/Llama-3.1-8B-Instruct\n    context_window_tokens: 32768\n"
         "    usd_per_gpu_hour: 2.5\n    pools:\n      aggregated:\n" + _pool(1_000_000, ["s0"]) +
         "  big:\n    kind: onprem\n    model: meta-llama/Llama-3.3-70B-Instruct\n    context_window_tokens: 32768\n"
         "    usd_per_gpu_hour: 2.5\n    default_mode: aggregated\n    pools:\n"
         "      aggregated:\n" + _pool(100, ["agg0"]) + "      prefill:\n" + _pool(10_000, ["pre0"])
         + "      decode:\n" + _pool(10_000, ["dec0"]))

POLICY = """\
apiVersion: pointsman/v1
kind: RoutingPolicy
filters: {budget: true}
disaggregation: {short_prompts_on_decode: true}
rules:
  - name: big
    route: {target: big, fallbacks: [small]}
"""

BODY = {"model": "auto", "max_tokens": 16, "messages": [{"role": "user", "content": "Hello there"}],
        "routing": {"tenant": "t"}}


def test_a_target_that_fits_where_it_is_placed_is_not_filtered_out(tmp_path):
    """The 70B-like ``big`` on its decode endpoint costs ~1/100 of its aggregated pool's price. Under a budget of 10x
    the decode hold it is served there (it fell back to ``small`` before); under half the decode hold even its
    cheapest placement does not fit, and the refusal prints that lower bound as "at least"."""
    fleet_path, policy_path, budgets = tmp_path / "fleet.yaml", tmp_path / "policy.yaml", tmp_path / "budgets.yaml"
    fleet_path.write_text(FLEET)
    policy_path.write_text(POLICY)
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets: []\n")
    fleet = load_fleet(fleet_path)
    s = Settings(data_dir=tmp_path / "svc", fleet_path=fleet_path, policy_path=policy_path, watch_policy=False,
                 watch_fleet=False, watch_budgets=False, scrape_interval_s=0, budgets_path=budgets)
    engine = RoutingEngine(fleet, load_policy(policy_path, fleet), FixedDifficulty(0.3), state=build_state(s, fleet))
    with TestClient(create_app(s, engine=engine, owns_engine=True)) as client:
        marked = client.post("/v1/telemetry", json={"endpoint": "agg0", "healthy": False, "reason": "test"})
        assert marked.status_code == 200, marked.text
        probe = client.post("/v1/route", json=BODY).json()  # no budget yet: the decode hold
        assert (probe["target"], probe["mode"], probe["base_url"]) == ("big", "aggregated", "http://dec0/v1"), probe
        on_decode = probe["estimated_cost_usd"]

        def limit(usd: float, tenant: str) -> None:
            budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                               f"  - {{scope: 'tenant:{tenant}', window: day, limit_usd: {usd!r}}}\n")
            assert client.post("/v1/budgets/reload").json()["ok"] is True

        limit(round(10 * on_decode, 9), "t")  # the decode hold fits; the aggregated pool's price (100x) does not
        served = client.post("/v1/route", json=BODY)
        assert served.status_code == 200, served.text
        assert (served.json()["target"], served.json()["base_url"]) == ("big", "http://dec0/v1"), served.json()

        limit(round(on_decode / 2, 9), "u")  # not even big's decode hold fits: small serves
        fallback = client.post("/v1/route", json={**BODY, "routing": {"tenant": "u", "explain": True}}).json()
        assert fallback["target"] == "small", fallback
        why = {c["target"]: c["excluded_by"] for c in fallback["trace"]["candidates"]}["big"]
        assert why.startswith(f"budget: estimated at least ${on_decode:.9f} does not fit the budget: tenant:u"), why
