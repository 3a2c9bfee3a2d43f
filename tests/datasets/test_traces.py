"""Trace loaders: Mooncake JSONL(.gz) and Azure LLM CSV, on small fixtures and on the shared files."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from pointsman.datasets.traces import TraceRequest, iter_azure_llm, iter_mooncake, load_trace
from pointsman.errors import DataError


def shared_datasets() -> Path | None:
    """``$POINTSMAN_SHARED_DATASETS``, else ``<repo>/../shared/datasets``; None if absent."""
    env = os.environ.get("POINTSMAN_SHARED_DATASETS")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / ".." / "shared" / "datasets"
    return path if path.is_dir() else None


MOONCAKE_ROWS = [
    {"timestamp": 1000, "input_length": 1000, "output_length": 7, "hash_ids": [0, 1]},
    {"timestamp": 1250, "input_length": 600, "output_length": 3, "hash_ids": [0, 2]},
    {"timestamp": 4000, "input_length": 12, "output_length": 1},
]


def write_mooncake(path: Path, rows: list[dict] | list[str]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    text = "\n".join(lines) + "\n"
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 23:59:59.9999999,374,44
2023-11-17 00:00:00.0000001,396,109
2023-11-17 00:00:01.5,10,1
2023-11-17 00:00:03,20,2
"""


def test_mooncake_plain_and_gzip(tmp_path: Path) -> None:
    for name in ("t.jsonl", "t.jsonl.gz"):
        path = write_mooncake(tmp_path / name, MOONCAKE_ROWS)
        got = load_trace(path)
        assert got == [
            TraceRequest(0.0, 1000, 7, (0, 1)),
            TraceRequest(0.25, 600, 3, (0, 2)),
            TraceRequest(3.0, 12, 1, None),
        ]


def test_azure_fraction_parsed_exactly(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(AZURE)
    got = load_trace(path)
    # 23:59:59.9999999 -> 00:00:00.0000001 is 200 ns across midnight
    assert [r.arrival_s for r in got] == [0.0, 2e-7, 1.5000001, 3.0000001]
    assert (got[1].prompt_tokens, got[1].output_tokens, got[1].block_hashes) == (396, 109, None)


def test_slicing_by_window_and_limit(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(AZURE)
    assert [r.prompt_tokens for r in iter_azure_llm(path, limit=2)] == [374, 396]
    assert [r.prompt_tokens for r in iter_azure_llm(path, start_s=1.0)] == [10, 20]
    assert [r.prompt_tokens for r in iter_azure_llm(path, start_s=1e-7, end_s=3.0)] == [396, 10]
    assert [r.prompt_tokens for r in iter_azure_llm(path, start_s=1e-7, limit=1)] == [396]
    assert list(iter_azure_llm(path, limit=0)) == []
    moon = write_mooncake(tmp_path / "m.jsonl", MOONCAKE_ROWS)
    assert [r.arrival_s for r in iter_mooncake(moon, end_s=3.0)] == [0.0, 0.25]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([MOONCAKE_ROWS[0], "{not json"], r"m\.jsonl:2: invalid JSON"),
        ([MOONCAKE_ROWS[0], {"timestamp": 5, "output_length": 2}], r"m\.jsonl:2: missing column 'input_length'"),
        ([{"timestamp": 0, "input_length": "ten", "output_length": 2}], r"m\.jsonl:1: column 'input_length'"),
        ([{"timestamp": 0, "input_length": 10, "output_length": 0}], r"m\.jsonl:1: column 'output_length'"),
        ([{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1, "a"]}], r"m\.jsonl:1: column 'hash_ids'"),
        ([{"timestamp": 9, "input_length": 10, "output_length": 2}, {"timestamp": 8, "input_length": 1, "output_length": 1}],
         r"m\.jsonl:2: column 'timestamp': time goes back"),
    ],
)  # fmt: skip
def test_mooncake_errors_name_file_line_and_column(tmp_path: Path, rows: list, message: str) -> None:
    path = write_mooncake(tmp_path / "m.jsonl", rows)
    with pytest.raises(DataError, match=message):
        load_trace(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("TIMESTAMP,ContextTokens\n", r"a\.csv:1: missing column\(s\) 'GeneratedTokens'"),
        (AZURE + "2023-11-17 00:00:04,x,3\n", r"a\.csv:6: column 'ContextTokens': expected an integer >= 1, got 'x'"),
        (AZURE + "2023-11-17 00:00:04,3,-1\n", r"a\.csv:6: column 'GeneratedTokens'"),
        (AZURE + "17/11/2023 00:00,3,1\n", r"a\.csv:6: column 'TIMESTAMP'"),
        (AZURE + "2023-11-17 00:00:02,3,1\n", r"a\.csv:6: column 'TIMESTAMP': time goes back"),
        (AZURE + "2023-11-17 00:00:04,3\n", r"a\.csv:6: expected 3 columns, got 2"),
    ],
)
def test_azure_errors_name_file_line_and_column(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "a.csv"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        load_trace(path)


def test_unknown_format_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown trace format"):
        load_trace(tmp_path / "trace.parquet")
    with pytest.raises(DataError, match="cannot open trace"):
        load_trace(tmp_path / "absent.jsonl")


def test_shared_traces() -> None:
    root = shared_datasets()
    if root is None:
        pytest.skip("shared datasets not found (set POINTSMAN_SHARED_DATASETS or check out ../shared beside the repo)")
    moon = load_trace(root / "mooncake" / "synthetic_trace.jsonl.gz")
    assert len(moon) == 3993  # README B2
    assert moon[0] == TraceRequest(0.0, 40160, 6, tuple(range(79)))
    assert moon[-1].arrival_s == pytest.approx(1022.025)
    assert sum(r.prompt_tokens for r in moon) / len(moon) == pytest.approx(15325.48, abs=0.01)
    assert all(len(r.block_hashes) == -(-r.prompt_tokens // 512) for r in moon)
    conv = load_trace(root / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv")
    code = load_trace(root / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv")
    assert (len(conv), len(code)) == (19366, 8819)  # README B1
    assert (conv[0].prompt_tokens, conv[0].output_tokens) == (374, 44)
    # second row: 18:15:50.9951690 - 18:15:46.6805900
    assert conv[1].arrival_s == pytest.approx(4.314579, abs=1e-9)
    assert sum(r.prompt_tokens for r in code) / len(code) == pytest.approx(2048, abs=1)


@pytest.mark.parametrize("name", ["trace.csv", "trace.csv.gz", "trace.jsonl", "trace.jsonl.gz"])
def test_a_byte_order_mark_is_read_past(tmp_path: Path, name: str) -> None:
    """A trace saved with a UTF-8 byte-order mark (Excel's 'CSV UTF-8', PowerShell) is the same trace:
    `pointsman replay` refused it (CSV: "missing column(s) 'TIMESTAMP'; header has ['\\ufeffTIMESTAMP', ...]",
    JSONL: "invalid JSON: Unexpected UTF-8 BOM")."""
    from click.testing import CliRunner

    from pointsman.cli.main import main
    from pointsman.policy.rules.compiler import STATIC_POLICY_PATH

    if ".csv" in name:
        text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,100,3\n"
                "2023-11-16 18:17:05.0000000,200,4\n")
    else:
        text = '{"timestamp": 0, "input_length": 100, "output_length": 3}\n' \
               '{"timestamp": 1500, "input_length": 200, "output_length": 4}\n'
    raw = b"\xef\xbb\xbf" + text.encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    res = CliRunner().invoke(main, ["replay", str(path), "--estimator", "fixed:0.5", "--outcomes", "none",
                                    "--no-baselines", "--policy", str(STATIC_POLICY_PATH),
                                    "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert doc["meta"]["requests"] == 2 and doc["runs"]["static"]["summary"]["requests"] == 2
    assert [r.prompt_tokens for r in load_trace(path)] == [100, 200]
