"""Prompts and outcomes drawn from the shared outcome tables (replay.outcomes)."""

from __future__ import annotations

import numpy as np
import pytest

from pointsman.datasets.sources import shared_datasets_dir
from pointsman.errors import DataError
from pointsman.replay.outcome_draw import OutcomeDraw, OutcomeRow, quality_of


@pytest.fixture(scope="module")
def mtbench() -> OutcomeDraw:
    try:
        shared_datasets_dir()
    except DataError:
        pytest.skip("shared datasets not found")
    return OutcomeDraw.load(["routellm_mtbench"], seed=3)


def test_judge_scores_normalized_and_rows_complete(mtbench: OutcomeDraw) -> None:
    assert len(mtbench.rows) <= 160 and len(mtbench.rows) > 150  # README A2: 160 rows, a few unscored
    weak = np.array([r.weak_score for r in mtbench.rows])
    strong = np.array([r.strong_score for r in mtbench.rows])
    assert weak.min() >= 0 and strong.max() <= 1  # 1-10 judge -> (s - 1) / 9
    assert strong.mean() > weak.mean()  # GPT-4 above Mixtral on MT-bench
    turn2 = next(r for r in mtbench.rows if r.prompt_id.endswith("-t2"))
    assert [m["role"] for m in turn2.messages] == ["user", "assistant", "user"]


def test_draw_is_deterministic_under_the_seed(mtbench: OutcomeDraw) -> None:
    a = mtbench.assign(500)
    assert (a == OutcomeDraw(mtbench.rows, 3, mtbench.sources).assign(500)).all()
    assert not (a == OutcomeDraw(mtbench.rows, 4, mtbench.sources).assign(500)).all()
    assert a.min() >= 0 and a.max() < len(mtbench.rows)


def test_quality_of_picks_the_side_that_ran() -> None:
    row = OutcomeRow("s", "p", ({"role": "user", "content": "x"},), 0.25, 0.75)
    assert quality_of(row, frontier=True) == 0.75 and quality_of(row, frontier=False) == 0.25
    assert quality_of(None, frontier=True) is None


def test_unknown_source_is_a_data_error() -> None:
    with pytest.raises(DataError, match="unknown outcome source"):
        OutcomeDraw.load(["nope"])


def test_named_columns_score_each_target_and_a_missing_one_is_named() -> None:
    try:
        shared_datasets_dir()
    except DataError:
        pytest.skip("shared datasets not found")
    columns = {"big": {"alpacaeval_ae1": "llama-2-70b-chat-hf"}, "other": {"routellm_mtbench": "nope"}}
    draw = OutcomeDraw.load(["alpacaeval_ae1"], target_columns=columns)
    assert len(draw.rows) == 604  # every row scored by all three columns
    big = np.array([r.target_scores["big"] for r in draw.rows])
    weak = np.array([r.weak_score for r in draw.rows])
    assert big.mean() > weak.mean() + 0.1  # Llama-2-70B-chat (~0.93) well above Llama-2-7B-chat (~0.72)
    row = draw.rows[0]
    assert quality_of(row, False, "big") == row.target_scores["big"]
    assert quality_of(row, False, "small") == row.weak_score and quality_of(row, True, "api") == row.strong_score
    with pytest.raises(DataError, match=r"f.yaml: targets.other.replay.quality_columns.routellm_mtbench names "
                                        r"model column 'nope', which the routellm_mtbench table lacks"):
        OutcomeDraw.load(["routellm_mtbench"], target_columns=columns, where="f.yaml")
