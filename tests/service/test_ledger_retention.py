"""The running service keeps budget ledger records ``record_retention_s`` and no longer: the real app with
a SQLite ledger purges settled records past it (``budget.db`` does not grow forever), and an outcome sent
again for a purged decision is not booked a second time (its signed id carries its time)."""

from __future__ import annotations

import sqlite3
import time

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from pointsman.service.app import create_app
from pointsman.service.settings import Settings

ADMIN = {"Authorization": "Bearer admin-secret-0123"}
GATEWAY = {"Authorization": "Bearer gateway-secret-0123"}
BODY = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 1000, "routing": {"tenant": "acme"}}


def records(path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*) FROM budget_reservations").fetchone()[0]


def spent(c) -> float:
    r = c.get("/v1/budgets", headers=ADMIN)
    assert r.status_code == 200, r.text
    return next(b for b in r.json()["budgets"] if b["window"] == "day")["settled_usd"]


def test_settled_records_are_purged_and_a_resent_outcome_is_not_booked_again(tmp_path):
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nreservation_ttl_s: 1\nrecord_retention_s: 1\n"
                       "budgets:\n  - {scope: 'tenant:acme', window: day, limit_usd: 5}\n")
    settings = Settings(data_dir=tmp_path / "svc", watch_policy=False, watch_fleet=False, watch_budgets=False,
                        scrape_interval_s=0, budgets_path=budgets,
                        gateway_api_keys=SecretStr("gw=gateway-secret-0123"),
                        admin_api_keys=SecretStr("ops=admin-secret-0123"))
    db = tmp_path / "svc" / "budget.db"
    with TestClient(create_app(settings)) as c:
        decision = c.post("/v1/route", json=BODY, headers=GATEWAY).json()
        outcome = {"decision_id": decision["decision_id"], "usage": {"prompt_tokens": 10, "completion_tokens": 10}}
        ack = c.post("/v1/outcomes", headers=GATEWAY, json=outcome)
        assert ack.status_code == 200, ack.text
        booked = ack.json()["acks"][0]["settlement"]["actual_cost_usd"]
        assert booked > 0 and spent(c) == pytest.approx(booked, abs=1e-9)
        deadline = time.monotonic() + 30
        while records(db) and time.monotonic() < deadline:  # the service's housekeeping purges it
            time.sleep(0.2)
        assert records(db) == 0, "settled record older than record_retention_s still in budget.db"
    with TestClient(create_app(settings)) as c:  # a restart: nothing in memory remembers the settlement
        for again in (outcome, {**outcome, "outcome_id": "resent-1"}):
            r = c.post("/v1/outcomes", headers=GATEWAY, json=again)
            assert r.status_code == 200, r.text
            assert spent(c) == pytest.approx(booked, abs=1e-9), r.text  # booked once
