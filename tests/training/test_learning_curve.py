"""``scripts/learning_curve.py`` on a tiny synthetic table: it logs every prompt through the
outcome log, trains cold and warm-started heads on n of them through ``train --from-outcomes``'s
training step and reports APGR on the held-out rest, as JSON and as a table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pointsman.datasets.sources import DEFAULT_TRAINING_SOURCES, SOURCES
from pointsman.errors import DataError
from pointsman.training.examples import EASY_ANCHORS

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "learning_curve.py"
HARD = ["prove the four colour theorem", "derive the Black-Scholes equation", "write a lock-free queue in C++",
        "explain the Riemann hypothesis", "design a consensus protocol", "optimise a SQL query plan"]
EASY = ["name a colour", "say hello", "count to five", "spell cat", "name a fruit", "greet a friend"]
TEMPLATES = ["Please {x}.", "Could you {x}?", "I need you to {x} now.", "{x}, thanks.", "Help me {x}."]


@pytest.fixture
def table(tmp_path):
    try:
        SOURCES[DEFAULT_TRAINING_SOURCES[0]].path().stat()
    except (DataError, OSError):
        pytest.skip("shared datasets not found (the warm start's prior rows live there)")
    lines = ["prompt_id,category,prompt,small,large"]
    i = 0
    for topics, hard in ((HARD, True), (EASY, False)):
        for x in topics:
            for t in TEMPLATES:
                lines.append(f'p{i},t,"{t.format(x=x)}",{0.0 if hard else 1.0},1.0')
                i += 1
    path = tmp_path / "tiny.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(table: Path, work: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--table", str(table), "--weak", "small", "--strong", "large",
                           "--ns", "10,all", "--seeds", "2", "--holdout-folds", "3", "--work", str(work), *extra],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_learning_curve_on_a_tiny_table(table, tmp_path):
    res = _run(table, tmp_path / "w", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["logged"] == 60 and out["prior_rows"] > 0 and set(out["prior_sources"]) == {*DEFAULT_TRAINING_SOURCES, EASY_ANCHORS}
    assert (tmp_path / "w" / "outcomes.db").is_file()  # a real outcome log
    rows = {r["key"]: r for r in out["rows"]}
    assert list(rows) == ["10", "all"] and rows["10"]["n"] == 10 and 30 < rows["all"]["n"] < 60
    for r in rows.values():
        assert len(r["cold_apgr"]) == len(r["warm_apgr"]) == 2
        assert r["prior_weight_per_row"] == pytest.approx(
            sum(200.0 / (n + 200.0) for n in r["n_per_seed"]) / 2)
        assert r["gain_mean"] == pytest.approx(r["warm_apgr_mean"] - r["cold_apgr_mean"])
        assert r["warm_vs_shipped_mean"] == pytest.approx(r["warm_apgr_mean"] - out["shipped"]["apgr_mean"])
    # The topic split is learnable: trained on every logged prompt, the head ranks above random.
    assert rows["all"]["cold_apgr_mean"] > 0.6 and rows["all"]["warm_apgr_mean"] > 0.6
    assert len(out["shipped"]["apgr"]) == 2

    text = _run(table, tmp_path / "t")
    assert text.returncode == 0, text.stderr[-2000:]
    assert "| logged n | prior weight / row | APGR cold | APGR warm | warm − cold | warm − shipped |" in text.stdout
    assert "| 0 (shipped model) |" in text.stdout and "| all (" in text.stdout


def test_bad_sizes_are_refused(table, tmp_path):
    res = _run(table, tmp_path / "w", "--ns", "ten")
    assert res.returncode != 0 and "--ns: expected positive counts or 'all', got 'ten'" in res.stderr
