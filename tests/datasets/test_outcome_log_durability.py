"""An acknowledged outcome survives a SIGKILL of the process that wrote it.

The writer runs in a fresh interpreter (``subprocess``, never a fork of the test
process): it appends outcomes one per call, from one thread or from several at once (their
calls share group commits), and prints each acknowledged id; the test kills it with SIGKILL
while it is writing, reopens the log and finds every printed id.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from pointsman.outcome_log.records import DecisionRecord
from pointsman.outcome_log.store import OutcomeLog

N_DECISIONS = 400
KILL_AFTER = 60

WRITER = textwrap.dedent("""
    import sys, threading
    from pointsman.outcome_log.store import OutcomeLog
    log = OutcomeLog(sys.argv[1], fsync_interval_s=float(sys.argv[4]))
    n, threads = int(sys.argv[2]), int(sys.argv[3])
    out = threading.Lock()

    def write(first):
        for i in range(first, n, threads):
            d = f"d{i:04d}"
            acks = log.append_outcomes([{"decision_id": d, "quality": {"judge_score": i},
                                         "usage": {"prompt_tokens": 100, "completion_tokens": i}},
                                        {"decision_id": d, "outcome_id": d + "-b", "shadow": True,
                                         "served_target": "frontier-large"}])
            if all(a.ok for a in acks):
                with out:
                    print(" ".join(a.outcome_id for a in acks), flush=True)

    workers = [threading.Thread(target=write, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
""")


def record(i: int) -> DecisionRecord:
    return DecisionRecord(
        decision_id=f"d{i:04d}", time_s=float(i), target="onprem-8b", model="m", mode="aggregated", rule="default",
        p_hard=0.5, difficulty_available=True, estimated_cost_usd=0.001, estimator_version="v", policy_revision="p",
        fleet_revision="f", request_features={"prompt_tokens": 100}, prompt_sha256="0" * 64, conversation_key=f"{i:016x}")


@pytest.mark.parametrize(("threads", "fsync_interval_s"), [(1, 0.0), (8, 0.0), (8, 0.1)])
def test_acknowledged_outcomes_survive_sigkill(tmp_path, threads, fsync_interval_s):
    """With the background fsync (``fsync_interval_s``) too: a killed process loses nothing it
    acknowledged (the WAL write is in the OS's page cache); only an OS crash could."""
    path = tmp_path / "log.db"
    with OutcomeLog(path) as log:
        assert log.append_decisions([record(i) for i in range(N_DECISIONS)]) == N_DECISIONS
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(N_DECISIONS), str(threads),
                             str(fsync_interval_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    acked: list[str] = []
    try:
        for line in proc.stdout:
            acked.extend(line.split())
            if len(acked) >= 2 * KILL_AFTER:
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    with OutcomeLog(path) as log:
        missing = [i for i in acked if log.outcome(i) is None]
        assert not missing, f"{len(missing)} acknowledged outcomes lost, e.g. {missing[:3]}"
        first = log.outcome(acked[0])
        assert first is not None and first.quality.judge_score == int(acked[0][1:5])
        stored = log.counts()["outcomes"]
    assert 2 * KILL_AFTER <= stored < 2 * N_DECISIONS  # killed mid-run, nothing acknowledged was lost
