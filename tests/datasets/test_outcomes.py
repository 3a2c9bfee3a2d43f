"""Outcome-table loading, sources' license guard and leakage-safe splits."""

import gzip

import numpy as np
import pytest

from pointsman.datasets.outcome_tables import read_outcome_table
from pointsman.datasets.sources import SOURCES, default_training_sources, get_source
from pointsman.datasets.splits import assign_folds, group_key
from pointsman.errors import DataError

CSV = "prompt_id,category,prompt,model-a,model-b\np1,x,Hello there,1,0\np2,x,What is 2+2?,0.5,\n"


def test_plain_and_gzip_read_the_same(tmp_path):
    plain = tmp_path / "t.csv"
    plain.write_text(CSV)
    gz = tmp_path / "t.csv.gz"
    with gzip.open(gz, "wt") as fh:
        fh.write(CSV)
    a, b = read_outcome_table(plain), read_outcome_table(gz)
    assert a.model_columns == b.model_columns == ["model-a", "model-b"]
    assert a.messages == b.messages == [
        [{"role": "user", "content": "Hello there"}],
        [{"role": "user", "content": "What is 2+2?"}],
    ]
    s = a.scores("model-b")
    assert s[0] == 0.0 and np.isnan(s[1])


def test_mtbench_turns_become_conversations(tmp_path):
    path = tmp_path / "mt.csv"
    path.write_text(
        "prompt_id,question_id,turn,category,prompt_turn1,prompt_turn2,weak,strong\n"
        "m-1-t1,1,1,writing,Write a poem,Make it shorter,8,9\n"
        "m-1-t2,1,2,writing,Write a poem,Make it shorter,7,9\n"
    )
    t = read_outcome_table(path)
    assert t.model_columns == ["weak", "strong"]  # question_id/turn are metadata
    assert t.messages[0] == [{"role": "user", "content": "Write a poem"}]
    assert [m["role"] for m in t.messages[1]] == ["user", "assistant", "user"]
    assert t.messages[1][2]["content"] == "Make it shorter"


def test_unknown_column_suggests_close_names(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(CSV)
    with pytest.raises(DataError) as err:
        read_outcome_table(path).column("model_a")
    msg = str(err.value)
    assert "Did you mean 'model-a'" in msg and "Available model columns: model-a, model-b" in msg


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"\x1f\x8b\x08\x00garbage", "cannot read"),
        (b"prompt_id,category,text,a\n1,x,y,1\n", "missing column 'prompt'"),
        (b"category,prompt,a\nx,y,1\n", "missing column 'prompt_id'"),
        (b"prompt_id,category,prompt\n1,x,y\n", "no numeric model score columns"),
        (b"", "cannot read"),
    ],
)
def test_bad_tables_raise_data_error(tmp_path, content, needle):
    path = tmp_path / "bad.csv.gz" if content.startswith(b"\x1f\x8b") else tmp_path / "bad.csv"
    path.write_bytes(content)
    with pytest.raises(DataError, match=needle):
        read_outcome_table(path)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        read_outcome_table(tmp_path / "nope.csv")


def test_license_guard_refuses_non_commercial_data():
    names = {s.name for s in default_training_sources()}
    assert "alpacaeval_ae1" not in names and names
    assert all(SOURCES[n].license in ("Apache-2.0", "MIT") for n in names)
    with pytest.raises(DataError, match="refusing.*alpacaeval_ae1 \\(CC-BY-NC-4.0\\)"):
        default_training_sources(["arena_bench_v1", "alpacaeval_ae1"])
    with pytest.raises(DataError, match="unknown outcome source"):
        get_source("mmlu")


def test_group_keys_and_folds_are_stable_and_leak_free():
    a = [{"role": "user", "content": "What  is 2+2?"}]
    b = [{"role": "user", "content": "what is 2+2? "}, {"role": "assistant", "content": ""},
         {"role": "user", "content": "and 3+3?"}]
    assert group_key(a) == group_key(b)  # same first user turn, whitespace/case normalized
    keys = [group_key(a), group_key(b), "k3", "k4", "k5"]
    f1 = assign_folds(keys, 5, seed=0)
    f2 = assign_folds(list(reversed(keys)), 5, seed=0)[::-1]
    assert list(f1) == list(f2)  # independent of order
    assert f1[0] == f1[1]
    assert set(assign_folds([str(i) for i in range(200)], 5)) == {0, 1, 2, 3, 4}
    with pytest.raises(ValueError):
        assign_folds(keys, 1)


def test_a_label_panel_names_table_columns_and_never_a_strong_one():
    """Arena-Bench-V1's label panel (``OutcomeSource.panel``): real columns of its table, no frontier
    model, every weak one; the panel's labels come out of ``build_examples`` beside the pair's."""
    from pointsman.training.examples import build_examples

    src = get_source("arena_bench_v1")
    table = read_outcome_table(src.path())
    assert set(src.panel) <= set(table.model_columns) and not set(src.panel) & set(src.strong)
    assert set(src.weak) <= set(src.panel) and "llama-13b" not in src.panel
    ex = build_examples([src], max_rows_per_source={src.name: 30})
    assert len(ex.y_panel) == len(ex) and np.all((ex.y_panel_gap >= 0) & (ex.y_panel_gap <= 1))
    # more models than the six weak ones: the panel's share is a different (denoised) number somewhere
    assert np.any(np.abs(ex.y_panel - ex.y) > 1e-9)


def test_group_key_collapses_whitespace_as_the_regex_did():
    """``group_key`` joins ``str.split()``: the same key as ``re.sub(r"\\s+", " ", text.strip().lower())``."""
    import hashlib
    import re

    texts = ["  Hello\u2003World\x1c\x1d x\u00a0y\u3000z\t\n ", "ÀB\u0085c  d", "", "\u200b a \u200b", "İstanbul  K"]
    for text in texts:
        norm = re.sub(r"\s+", " ", text.strip().lower())
        assert group_key([{"role": "user", "content": text}]) == hashlib.sha1(norm.encode()).hexdigest()[:16]
