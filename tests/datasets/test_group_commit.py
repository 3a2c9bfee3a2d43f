"""Group commit (``pointsman.group_commit``, what ``OutcomeLog.append_outcomes`` runs on): calls
queued behind a commit in progress share the next one, each gets its own result, and a failed
commit fails exactly the calls it held."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from pointsman.group_commit import GroupCommit
from pointsman.outcome_log.store import OutcomeLog


def _wait_until(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def test_calls_behind_a_commit_share_the_next_one_and_get_their_own_results():
    gate, batches = threading.Event(), []

    def commit(calls: Sequence[int]) -> list[int]:
        batches.append(list(calls))
        if len(batches) == 1:
            gate.wait(10)  # the first commit's fsync, still running while the others arrive
        return [c * 10 for c in calls]

    group: GroupCommit[int, int] = GroupCommit(commit)
    results: dict[int, int] = {}

    def call(i: int) -> None:
        results[i] = group.run(i)

    first = threading.Thread(target=call, args=(0,))
    first.start()
    _wait_until(lambda: len(batches) == 1)
    others = [threading.Thread(target=call, args=(i,)) for i in range(1, 9)]
    for t in others:
        t.start()
    _wait_until(lambda: len(group._queue) == 8)
    gate.set()
    for t in [first, *others]:
        t.join(10)
    assert batches[0] == [0] and sorted(batches[1]) == list(range(1, 9)) and len(batches) == 2
    assert results == {i: i * 10 for i in range(9)}
    assert (group.batches, group.calls) == (2, 9)


def test_a_failed_commit_fails_its_calls_only():
    calls_seen: list[list[str]] = []

    def commit(calls: Sequence[str]) -> list[str]:
        calls_seen.append(list(calls))
        if "bad" in calls:
            raise OSError("disk full")
        return [c.upper() for c in calls]

    group: GroupCommit[str, str] = GroupCommit(commit)
    with pytest.raises(OSError, match="disk full"):
        group.run("bad")
    assert group.run("ok") == "OK"  # the next batch is tried anew
    assert calls_seen == [["bad"], ["ok"]]


def test_concurrent_appends_are_each_acknowledged_once_and_stored(tmp_path):
    """Threads appending at once (some the same outcome): every acknowledged outcome is in the log,
    each key stored once, repeats acknowledged as duplicate, the same content never a conflict."""
    known = {f"d{i}": "onprem-8b" for i in range(40)}
    acks: list[tuple[str, str]] = []
    lock = threading.Lock()
    with OutcomeLog(tmp_path / "log.db") as log:
        def write(k: int) -> None:
            for i in range(k, 40, 4):
                for _ in range(2):  # each outcome twice: once stored, once duplicate
                    got = log.append_outcomes([{"decision_id": f"d{i}", "usage": {"prompt_tokens": 10,
                                                                                    "completion_tokens": i}}],
                                              known=known)
                    with lock:
                        acks.extend((a.outcome_id, a.status) for a in got)

        threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert log.counts()["outcomes"] == 40
        for i in range(40):
            stored = log.outcome(f"d{i}")
            assert stored is not None and stored.usage.completion_tokens == i
    statuses = sorted(s for key, s in acks)
    assert statuses == ["duplicate"] * 40 + ["stored"] * 40


def test_background_fsync_mode_syncs_each_commit_and_reports_a_failed_fsync(tmp_path):
    """``fsync_interval_s > 0``: appends return once in the WAL, the syncer ``fsync``s after them
    (at close at the latest), and an ``fsync`` failure makes the log not writable (``/readyz``)."""
    with OutcomeLog(tmp_path / "log.db", fsync_interval_s=0.01) as log:
        acks = log.append_outcomes([{"decision_id": "d1"}], known={"d1": "onprem-8b"})
        assert [a.status for a in acks] == ["stored"]
        syncer = log._keeper
        assert syncer.fsync
        _wait_until(lambda: syncer.syncs >= 1)
        assert log.writable() is None
        wal = syncer.wal_path
        (tmp_path / "a-file").write_text("")
        syncer.wal_path = tmp_path / "a-file" / "x-wal"  # a WAL that cannot be opened (ENOTDIR), even as root
        log.append_outcomes([{"decision_id": "d2"}], known={"d2": "onprem-8b"})
        _wait_until(lambda: syncer.error is not None)
        assert "fsync failed" in (log.writable() or "")
        syncer.wal_path = wal  # the disk is back: the retried sync clears the error
        _wait_until(lambda: syncer.error is None)
        assert log.writable() is None
    with OutcomeLog(tmp_path / "log.db") as log:
        assert log.outcome("d1") is not None and log.outcome("d2") is not None
    with pytest.raises(ValueError, match="fsync_interval_s"):
        OutcomeLog(tmp_path / "other.db", fsync_interval_s=-1)


def test_the_wal_is_checkpointed_in_the_background_never_in_a_commit(tmp_path, monkeypatch):
    """The log's connection never checkpoints (no commit pays for one); the keeper thread does, once
    the WAL holds ``CHECKPOINT_BYTES``, in both durability modes."""
    import sqlite3

    from pointsman.outcome_log import store

    monkeypatch.setattr(store, "CHECKPOINT_BYTES", 64 * 1024)
    for fsync_interval_s in (0.0, 0.01):
        path = tmp_path / f"log-{fsync_interval_s}.db"
        with OutcomeLog(path, fsync_interval_s=fsync_interval_s) as log:
            assert log._conn is not None and log._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
            log._keeper.interval_s = 0.01
            for i in range(120):
                log.append_outcomes([{"decision_id": f"d{i}", "status": "error", "error": "x" * 1000}], known={f"d{i}": "onprem-8b"})
            _wait_until(lambda: log._keeper.checkpoints >= 1)
        with sqlite3.connect(path) as conn:  # nothing lost on the way
            assert conn.execute("SELECT COUNT(*) FROM outcomes").fetchone()[0] == 120
