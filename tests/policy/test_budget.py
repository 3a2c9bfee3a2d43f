"""Budget configuration, UTC windows and snapshots: the backend-free parts of the ledger."""

import math
from datetime import UTC, datetime

import pytest

from pointsman.errors import BudgetError, ConfigError
from pointsman.policy.budget.config import Budget, BudgetConfig, BudgetConfigError
from pointsman.policy.budget.factory import open_ledger
from pointsman.policy.budget.ledger import BudgetSnapshot, BudgetStatus, EffectivePrice
from pointsman.policy.budget.sqlite_ledger import SqliteLedger
from pointsman.policy.budget.units import to_nusd, window_of
from pointsman.policy.signals.namespaces import budget_signals


def ts(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


def test_from_dict_reads_budgets_and_timing():
    cfg = BudgetConfig.from_dict({
        "apiVersion": "pointsman/v1", "kind": "Budgets", "reservation_ttl_s": 120,
        "budgets": [{"scope": "tenant:acme", "window": "month", "limit_usd": 2000},
                    {"scope": "team:acme/search", "window": "day", "limit_usd": 0},
                    {"scope": "tenant:acme", "window": "day", "limit_usd": 80.5}]})
    assert cfg.reservation_ttl_s == 120.0
    assert cfg.budgets[0] == Budget("tenant:acme", "month", 2000.0)
    assert [b.window for b in cfg.budgets_for(["tenant:acme"])] == ["month", "day"]
    assert cfg.budgets_for(["key:unknown"]) == []
    assert BudgetConfig.from_dict(cfg.to_dict()) == cfg


def test_every_problem_names_its_key():
    with pytest.raises(BudgetConfigError) as err:
        BudgetConfig.from_dict({"budgets": [{"scope": "acme", "window": "week", "limit_usd": -1},
                                            {"scope": "key:k1", "window": "day", "limt_usd": 3}],
                                "reservation_ttl": 5})
    text = str(err.value)
    assert "budgets[0].scope: 'acme' is not a scope" in text
    assert "budgets[0].window" in text
    assert "budgets[0].limit_usd" in text and "greater than or equal to 0" in text
    assert "unknown key 'limt_usd' in budgets[1]; did you mean 'limit_usd'?" in text
    assert "missing required key 'limit_usd' in budgets[1]" in text
    assert "unknown key 'reservation_ttl'; did you mean 'reservation_ttl_s'?" in text
    assert len(err.value.problems) == 6
    assert isinstance(err.value, ConfigError) and isinstance(err.value, BudgetError)


@pytest.mark.parametrize("limit", [True, "3", float("nan"), float("inf"), None])
def test_limit_must_be_a_real_number(limit):
    with pytest.raises(BudgetConfigError, match=r"budgets\[0\]\.limit_usd"):
        BudgetConfig.from_dict({"budgets": [{"scope": "tenant:a", "window": "day", "limit_usd": limit}]})


def test_duplicates_and_retention_are_rejected():
    with pytest.raises(BudgetConfigError, match=r"budgets\[1\] repeats scope 'tenant:a' window 'day' of budgets\[0\]"):
        BudgetConfig.from_dict({"budgets": [{"scope": "tenant:a", "window": "day", "limit_usd": 1},
                                            {"scope": "tenant:a", "window": "day", "limit_usd": 2}]})
    with pytest.raises(BudgetConfigError, match="record_retention_s"):
        BudgetConfig.from_dict({"reservation_ttl_s": 100, "record_retention_s": 50})
    with pytest.raises(BudgetConfigError, match="expected a mapping"):
        BudgetConfig.from_dict([])
    with pytest.raises(BudgetConfigError, match="limit_usd"):
        BudgetConfig(budgets=(Budget("tenant:a", "day", -2.0),))


def test_budgets_file_problems_are_located(tmp_path):
    path = tmp_path / "budgets.yaml"
    path.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                    "  - scope: tenant:acme\n    window: day\n    limit_usd: 10\n"
                    "  - scope: tenant:acme\n    window: fortnight\n    limit_usd: 10\n")
    with pytest.raises(BudgetConfigError) as err:
        BudgetConfig.load(path)
    assert str(err.value).startswith(f"{path}:8:13: invalid-value: budgets[1].window")
    path.write_text("budgets:\n  - {scope: tenant:acme, window: day, limit_usd: 10}\n")
    assert BudgetConfig.load(path).budgets == (Budget("tenant:acme", "day", 10.0),)


def test_windows_are_utc_calendar_windows():
    d = window_of("day", ts(2025, 3, 14, 23, 59, 59))
    assert (d.id, d.start_s, d.end_s) == ("day:2025-03-14", ts(2025, 3, 14), ts(2025, 3, 15))
    assert window_of("day", ts(2025, 3, 15)).id == "day:2025-03-15"
    m = window_of("month", ts(2024, 12, 31, 12))
    assert (m.id, m.start_s, m.end_s) == ("month:2024-12", ts(2024, 12, 1), ts(2025, 1, 1))
    assert window_of("month", ts(2024, 2, 29, 23, 59)).end_s == ts(2024, 3, 1)
    with pytest.raises(BudgetError, match="unknown budget window 'week'"):
        window_of("week", 0.0)


def test_amounts_are_exact_nano_usd():
    assert to_nusd(0.1) + to_nusd(0.2) == to_nusd(0.3)
    for bad in (-0.01, float("nan"), float("inf"), "1", True):
        with pytest.raises(BudgetError, match="cost_usd"):
            to_nusd(bad)


def _status(scope, window, limit, settled, reserved):
    return BudgetStatus(scope, window, f"{window}:x", 0.0, limit, settled, reserved)


def test_snapshot_binding_fits_and_signals():
    snap = BudgetSnapshot(0.0, (
        _status("tenant:a", "day", 10.0, 4.0, 1.0), _status("tenant:a", "month", 100.0, 90.0, 8.0),
        _status("team:b", "day", None, 3.0, 0.0), _status("team:b", "month", None, 3.0, 0.0)))
    assert snap.binding.window == "month" and snap.remaining_usd == pytest.approx(2.0)
    assert snap.remaining_by_scope() == {"tenant:a": pytest.approx(2.0), "team:b": math.inf}
    assert snap.fits(2.0) and not snap.fits(2.000001)
    signals = budget_signals(snap, 0.0)
    assert {k: signals[k] for k in ("remaining_usd", "spent_usd", "limit_usd", "window", "scope", "limited")} == {
        "remaining_usd": pytest.approx(2.0), "spent_usd": pytest.approx(98.0),
        "limit_usd": 100.0, "window": "month", "scope": "tenant:a", "limited": True}
    unlimited = BudgetSnapshot(0.0, (_status("team:b", "day", None, 3.0, 0.0),))
    assert unlimited.binding is None and unlimited.fits(1e9)
    assert budget_signals(unlimited, 0.0)["remaining_usd"] == math.inf and budget_signals(unlimited, 0.0)["limited"] is False
    exhausted = BudgetSnapshot(0.0, (_status("tenant:a", "day", 1.0, 1.0, 0.0),))
    assert not exhausted.fits(0.0)  # an exhausted budget refuses even a free request
    zero = BudgetSnapshot(0.0, (_status("tenant:a", "day", 0.0, 0.0, 0.0),))
    assert not zero.fits(0.0)


def test_effective_price_divides_by_completion_tokens():
    p = EffectivePrice("t", "day", "day:x", 3.0, 2, prompt_tokens=500, cached_tokens=100, completion_tokens=100)
    assert p.usd_per_token == pytest.approx(0.03) and p.total_tokens == 600
    assert p.usd_per_total_token == pytest.approx(0.005)
    assert EffectivePrice("t", "day", "day:x", 0.0, 0, 0, 0, 0).usd_per_token is None


def test_open_ledger_by_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    default = open_ledger(None, data_dir=tmp_path / "data")
    assert isinstance(default, SqliteLedger) and default.path == tmp_path / "data" / "budget.db"
    rel = open_ledger("sqlite:///sub/ledger.db?synchronous=full")
    assert rel.path.resolve() == (tmp_path / "sub" / "ledger.db").resolve() and rel.synchronous == "full"
    absolute = open_ledger(f"sqlite:///{tmp_path}/abs.db")
    assert absolute.path == tmp_path / "abs.db"
    for ledger in (default, rel, absolute):
        ledger.close()
    with pytest.raises(BudgetError, match="scheme 'postgres'"):
        open_ledger("postgres://x/y")
    with pytest.raises(BudgetError, match="unknown parameter"):
        open_ledger("sqlite:///x.db?fsync=1")
    with pytest.raises(BudgetError, match="synchronous"):
        open_ledger("sqlite:///x.db?synchronous=off")


def test_backend_failures_are_ledger_unavailable(tmp_path):
    import socket

    from pointsman.policy.budget.ledger import LedgerUnavailable
    from pointsman.policy.budget.redis_ledger import RedisLedger

    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(LedgerUnavailable, match="budget ledger"):
        SqliteLedger(tmp_path / "file" / "ledger.db")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = RedisLedger.from_url(f"redis://127.0.0.1:{port}/0", timeout_s=0.2)
    with pytest.raises(LedgerUnavailable, match="redis"):
        down.reserve("d", ["tenant:a"], 0.1, 0.0)
    with pytest.raises(LedgerUnavailable):
        down.effective_price_per_token("t")


@pytest.mark.parametrize("retention", [1.0, 300.0])
def test_a_retention_too_short_to_restore_is_refused_only_for_a_restored_redis_ledger(tmp_path, retention):
    """``record_retention_s`` at or under ``RESTORE_MARGIN_S`` (300 s) would never let ``restore_spend`` book anything
    on a Redis ledger: its service refuses the file, naming the field and the minimum; the SQLite ledger (and a
    Redis ledger without a spend journal: the CLI) takes it."""
    from pointsman.service.bootstrap import open_budget_ledger
    from pointsman.service.settings import Settings

    path = tmp_path / "budgets.yaml"
    path.write_text(f"kind: Budgets\nreservation_ttl_s: 1\nrecord_retention_s: {retention}\nbudgets: []\n")
    with pytest.raises(BudgetConfigError) as err:
        open_budget_ledger(Settings(budget_ledger="redis://127.0.0.1:1/0", budgets_path=path), journal=True)
    assert str(err.value).startswith(f"{path}:3:21: invalid-value: record_retention_s ({retention:g}) must be "
                                     "more than 300 s with a Redis budget ledger")
    assert BudgetConfig.load(path, restored=False).record_retention_s == retention
    ledger = open_budget_ledger(Settings(budget_ledger=None, budgets_path=path, data_dir=tmp_path), journal=True)
    assert ledger.config.record_retention_s == retention
    ledger.close()


def test_a_retention_just_over_the_margin_is_taken_for_a_redis_ledger(tmp_path):
    path = tmp_path / "budgets.yaml"
    path.write_text("kind: Budgets\nreservation_ttl_s: 60\nrecord_retention_s: 301\nbudgets: []\n")
    assert BudgetConfig.load(path, restored=True).record_retention_s == 301
