"""The outcome log stores ``served_endpoint`` and ``upstream_status`` (outcomes) and ``prompt_tokens`` (decisions),
also in a file an earlier Pointsman made (without those columns): opening it adds them, the rows stored before read
None, and it opens again unchanged."""

from __future__ import annotations

import sqlite3
import threading

from pointsman.outcome_log.records import DecisionRecord
from pointsman.outcome_log.store import SCHEMA_VERSION, OutcomeLog


def _columns(path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [r[1] for r in conn.execute("PRAGMA table_info(outcomes)")]


def _old_file(path) -> None:
    """A file as the earlier Pointsman (cf5165d) left it: its outcomes table without the two columns."""
    with OutcomeLog(path) as log:  # one outcome stored as the earlier Pointsman stores it
        log.append_outcomes([{"decision_id": "d0", "status": "error"}], known={"d0": "onprem-8b"})
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE outcomes DROP COLUMN served_endpoint")
        conn.execute("ALTER TABLE outcomes DROP COLUMN upstream_status")
    assert "served_endpoint" not in _columns(path)


def test_an_earlier_file_gets_the_columns_and_keeps_its_rows(tmp_path):
    path = tmp_path / "outcomes.db"
    _old_file(path)
    with OutcomeLog(path) as log:
        old = log.outcome("d0")
        assert old is not None and (old.status, old.served_endpoint, old.upstream_status) == ("error", None, None)
        acks = log.append_outcomes([{"decision_id": "d1", "status": "error", "upstream_status": 503,
                                     "served_endpoint": "http://llama-8b-1.inference.internal:8000/v1"}],
                                   known={"d1": "onprem-8b"})
        assert acks[0].status == "stored"
    with OutcomeLog(path) as log:  # opened again: nothing to add
        new = log.outcome("d1")
        assert new is not None and (new.served_endpoint, new.upstream_status) == (
            "http://llama-8b-1.inference.internal:8000/v1", 503)
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    assert _columns(path)[-2:] == ["served_endpoint", "upstream_status"]


def test_two_logs_opening_an_earlier_file_add_the_columns_once(tmp_path):
    path = tmp_path / "outcomes.db"
    _old_file(path)
    barrier, errors = threading.Barrier(4), []

    def open_it() -> None:
        barrier.wait()
        try:
            OutcomeLog(path).close()
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)
    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _columns(path).count("served_endpoint") == 1


def test_an_earlier_decisions_table_gets_the_prompt_tokens_column(tmp_path):
    path = tmp_path / "outcomes.db"

    def record(i: int, prompt_tokens: int | None) -> DecisionRecord:
        return DecisionRecord(f"d{i}", float(i), "frontier-small", "m", "aggregated", "default", 0.5, True, 0.001, "v", "p",
                              "f", {"prompt_tokens": 10}, "0" * 64, "k", prompt_tokens=prompt_tokens)
    with OutcomeLog(path) as log:
        log.append_decision(record(0, None))
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE decisions DROP COLUMN prompt_tokens")
    with OutcomeLog(path) as log:
        log.append_decision(record(1, 48_179))
        old, new = log.decision("d0"), log.decision("d1")
        assert old is not None and new is not None and (old.prompt_tokens, new.prompt_tokens) == (None, 48_179)
