"""The service's parts without HTTP: the decision log writer, the estimator deadline, the model
follower's failure paths, and the API key ring."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from pointsman.estimator.estimate import DifficultyEstimate, FixedDifficulty
from pointsman.outcome_log.store import OutcomeLog
from pointsman.policy.engine import RoutingEngine
from pointsman.policy.fleet import load_fleet
from pointsman.policy.rules.compiler import STATIC_POLICY_PATH, load_policy
from pointsman.request import request_from_prompt
from pointsman.service.auth import KeyRing
from pointsman.service.deadline import DeadlineEstimator, estimator_pool
from pointsman.service.decision_log import DecisionLogWriter
from pointsman.service.live_engine import LiveEngine
from pointsman.service.model_follower import ModelFollower, followed, key_of


@pytest.fixture(scope="module")
def engine():
    fleet = load_fleet()
    return RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.3))


def test_writer_commits_on_flush_and_drains_on_close(tmp_path, engine):
    results: list[tuple[str, int]] = []
    with OutcomeLog(tmp_path / "log.db") as log:
        writer = DecisionLogWriter(log, flush_interval_s=30.0, on_result=lambda r, n: results.append((r, n))).start()
        ids = []
        for i in range(5):
            req = request_from_prompt(f"question {i}")
            d = engine.route(req, dispatch=False)
            assert writer.submit(d, req, engine.estimator)
            ids.append(d.decision_id)
        assert writer.flush(timeout_s=10)  # does not wait for the 30 s interval
        assert all(log.decision(i) is not None for i in ids) and writer.pending == 0
        req = request_from_prompt("last one")
        last = engine.route(req, dispatch=False)
        writer.submit(last, req, engine.estimator)
        writer.close()
        assert log.decision(last.decision_id) is not None and not writer.alive
        assert writer.written == 6 and sum(n for r, n in results if r == "written") == 6
        assert not writer.submit(last, req, engine.estimator) and writer.dropped == 1  # closed: counted


def test_writer_flushes_only_for_the_decisions_still_in_memory(tmp_path, engine):
    """``flush(decision_ids=...)`` commits those decisions (and the ones queued before them) at once, and
    does nothing when none of them is still in memory: an outcome of a decision committed long ago does not
    make the writer commit the decisions answered since."""
    with OutcomeLog(tmp_path / "log.db") as log:
        writer = DecisionLogWriter(log, flush_interval_s=30.0).start()
        decisions = []
        for i in range(3):
            req = request_from_prompt(f"question {i}")
            decisions.append(engine.route(req, dispatch=False))
            assert writer.submit(decisions[-1], req, engine.estimator)
        assert writer.flush(timeout_s=10, decision_ids=["not-decided-here"]) and writer.pending == 3
        assert writer.flush(timeout_s=10, decision_ids=["not-decided-here", decisions[1].decision_id])
        assert all(log.decision(d.decision_id) is not None for d in decisions[:2])
        req = request_from_prompt("a later one")
        later = engine.route(req, dispatch=False)
        writer.submit(later, req, engine.estimator)
        assert writer.flush(timeout_s=10, decision_ids=[decisions[0].decision_id]) and writer.pending == 1
        assert writer.flush(timeout_s=10, decision_ids=[later.decision_id]) and writer.pending == 0
        assert log.decision(later.decision_id) is not None
        writer.close()


def test_writer_drops_and_counts_beyond_its_queue(tmp_path, engine):
    with OutcomeLog(tmp_path / "log.db") as log:
        writer = DecisionLogWriter(log, max_queue=2)  # not started: nothing drains
        req = request_from_prompt("q")
        d = engine.route(req, dispatch=False)
        assert [writer.submit(d, req, engine.estimator) for _ in range(3)] == [True, True, False]
        assert writer.dropped == 1 and writer.pending == 2
        assert writer.flush(timeout_s=0.1) is False  # the writer is not running


class Hanging:
    version = "hang-1"
    tokenizer = None

    def __init__(self) -> None:
        self.release = threading.Event()

    def estimate(self, features):
        self.release.wait(5)
        return DifficultyEstimate(0.5, True, 1.0, None)


class Broken:
    version = "broken-1"
    tokenizer = None

    def estimate(self, features):
        raise RuntimeError("onnx session lost")


def test_deadline_turns_hangs_and_errors_into_unavailable():
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        hanging = Hanging()
        est = DeadlineEstimator(hanging, 20, pool)
        first = est.estimate(None)
        second = est.estimate(None)  # the only worker is stuck: waits in the queue, times out too
        assert not first.available and first.error.startswith("timeout: no estimate within the 20 ms budget")
        assert not second.available and second.error.startswith("timeout:")
        assert est.version == "hang-1" and est.tokenizer is None
        hanging.release.set()
        broken = DeadlineEstimator(Broken(), 1000, pool).estimate(None)
        assert not broken.available and broken.error == "RuntimeError: onnx session lost"
    finally:
        pool.shutdown(wait=True)
    after = DeadlineEstimator(Broken(), 1000, pool).estimate(None)
    assert not after.available and after.error.startswith("estimator pool unavailable")
    with pytest.raises(ValueError):
        DeadlineEstimator(Broken(), 0, pool)


def test_deadline_on_the_event_loop_through_the_service_pool():
    """``estimate_async`` on the service's pool (``estimator_pool``, what ``pointsman serve`` uses): a hung
    estimator times out, a queued estimate behind it times out too and never runs, an error comes back
    as unavailable, a good estimate as itself, and a cancelled caller stays cancelled."""
    pool = estimator_pool(workers=1)
    hanging = Hanging()
    calls: list[object] = []

    class Counting(Hanging):
        def estimate(self, features):
            calls.append(features)
            return super().estimate(features)

    async def scenario() -> None:
        est = DeadlineEstimator(Counting(), 20, pool)
        est.inner.release = hanging.release
        first, second = await asyncio.gather(est.estimate_async("a"), est.estimate_async("b"))
        assert first.error.startswith("timeout: no estimate within the 20 ms budget")
        assert second.error.startswith("timeout:")
        hanging.release.set()
        broken = await DeadlineEstimator(Broken(), 1000, pool).estimate_async(None)
        assert not broken.available and broken.error == "RuntimeError: onnx session lost"
        good = await DeadlineEstimator(FixedDifficulty(0.25), 1000, pool).estimate_async(None)
        assert good.available and good.p_hard == 0.25
        hanging.release.clear()
        waiting = asyncio.ensure_future(DeadlineEstimator(hanging, 5000, pool).estimate_async(None))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    try:
        asyncio.run(scenario())
        assert calls == ["a"]  # "b" timed out in the queue and was dropped there
    finally:
        hanging.release.set()
        pool.shutdown(wait=True)
    after = asyncio.run(DeadlineEstimator(Broken(), 1000, pool).estimate_async(None))
    assert not after.available and after.error.startswith("estimator pool unavailable")


def test_a_bounded_estimator_runs_on_the_callers_thread_and_the_bundled_one_is_bounded(tmp_path, monkeypatch):
    """An estimator of bounded cost (``bounded_cost``) is called on the caller's thread, sync and async, its
    exception still an unavailable estimate; one without it goes to the pool. Through ``pointsman serve``'s
    app the bundled (static) model is bounded, and its estimates run on the event loop's thread, never on
    the deadline's pool, with the same ``p_hard`` as the estimator called directly."""
    from fastapi.testclient import TestClient

    from pointsman.estimator.difficulty import DifficultyEstimator
    from pointsman.service.app import create_app
    from pointsman.service.settings import Settings

    threads: list[str] = []

    class Bounded(FixedDifficulty):
        bounded_cost = True

        def estimate(self, features):
            threads.append(threading.current_thread().name)
            return super().estimate(features)

    class BoundedBroken(Broken):
        bounded_cost = True

    pool = estimator_pool(workers=1)
    try:
        bounded = DeadlineEstimator(Bounded(0.3), 1000, pool)
        assert bounded.inline and not DeadlineEstimator(Hanging(), 1000, pool).inline
        assert bounded.estimate(None).p_hard == 0.3
        assert asyncio.run(bounded.estimate_async(None)).p_hard == 0.3
        assert threads == [threading.current_thread().name] * 2
        broken = asyncio.run(DeadlineEstimator(BoundedBroken(), 1000, pool).estimate_async(None))
        assert not broken.available and broken.error == "RuntimeError: onnx session lost"
    finally:
        pool.shutdown(wait=True)

    seen: list[tuple[str, float | None]] = []
    estimate = DifficultyEstimator.estimate

    def recording(self, features, query_token_ids=None):
        out = estimate(self, features, query_token_ids)
        seen.append((threading.current_thread().name, out.p_hard))
        return out
    monkeypatch.setattr(DifficultyEstimator, "estimate", recording)
    app = create_app(Settings(data_dir=tmp_path, watch_policy=False, watch_fleet=False, scrape_interval_s=0))
    with TestClient(app) as client:
        served = app.state.runtime.live.engine.estimator
        assert isinstance(served, DeadlineEstimator) and served.inline and served.inner.bounded_cost
        body = {"messages": [{"role": "user", "content": "Prove that there are infinitely many primes."}]}
        answer = client.post("/v1/route", json=body)
        assert answer.status_code == 200, answer.text
    assert len(seen) == 1 and not seen[0][0].startswith("pointsman-estimator")
    assert answer.json()["p_hard"] == pytest.approx(seen[0][1], abs=1e-6)


def test_the_kept_decision_is_the_decision_without_its_trace_builder(engine):
    """``commit_decision`` hands the writer ``without_trace_builder(decision)``: the same as
    ``dataclasses.replace(decision, trace_builder=None)``, field by field, with and without a built trace."""
    import dataclasses

    from pointsman.request import parse_route_request
    from pointsman.service.routes_decisions import without_trace_builder

    for explain in (False, True):
        decision = engine.route(parse_route_request({"messages": [{"role": "user", "content": "Prove that 2+2=4."}],
                                                     "routing": {"explain": explain}}), dispatch=False)
        kept, replaced = without_trace_builder(decision), dataclasses.replace(decision, trace_builder=None)
        assert type(kept) is type(replaced) and kept is not decision
        assert kept.__dict__ == replaced.__dict__ and kept == replaced
        assert kept.trace == replaced.trace == {} and decision.trace_builder is not None


def test_estimator_pool_runs_as_many_jobs_at_once_as_it_has_workers_and_drains_on_shutdown():
    """Four workers take four blocking jobs at once (each job wakes an idle worker); a fifth waits in the
    queue and runs when one frees; after ``shutdown`` nothing new is taken and the queued jobs still run."""
    pool = estimator_pool(workers=4)
    release, started = threading.Event(), threading.Semaphore(0)

    def job(i: int) -> int:
        started.release()
        release.wait(10)
        return i

    futures = [pool.submit(job, i) for i in range(5)]
    for _ in range(4):
        assert started.acquire(timeout=10)
    assert not started.acquire(timeout=0.05) and not futures[4].done()  # no fifth worker
    pool.shutdown(wait=False)
    with pytest.raises(RuntimeError):
        pool.submit(job, 6)
    release.set()
    assert [f.result(timeout=10) for f in futures] == [0, 1, 2, 3, 4]
    pool.shutdown(wait=True)


class Versioned(FixedDifficulty):
    """A fixed-difficulty stand-in for registry version ``n``."""

    def __init__(self, n: int) -> None:
        super().__init__(0.3)
        self.version = f"v{n}"
        self.source = f"models:/pointsman-difficulty/{n} (@champion)"


def test_follower_keeps_serving_when_the_registry_or_the_new_model_fails(engine):
    live = LiveEngine(engine.with_estimator(Versioned(1)))
    answers = iter([RuntimeError("registry down"), "2", "2"])

    def resolve(spec: str) -> str:
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    loads = iter([(None, "OSError: artifact missing"), (Versioned(2), None)])
    swaps = []
    f = ModelFollower(live, "champion", load=lambda spec: next(loads), resolve=resolve, on_result=swaps.append)
    assert f.current == "1"
    assert f.poll_once() is None and f.last_error == "cannot read the model registry (RuntimeError: registry down)"
    assert live.follow.registry_reachable is False and live.follow.serving == "1"
    assert live.engine.estimator.version == "v1"
    failed = f.poll_once()
    assert not failed.ok and failed.error == "OSError: artifact missing" and live.engine.estimator.version == "v1"
    ok = f.poll_once()  # the next poll tries again
    assert ok.ok and (ok.previous_version, ok.version) == ("v1", "v2") and live.engine.estimator.version == "v2"
    assert [s.ok for s in swaps] == [False, True] and f.current == "2"


def test_followed_specs_and_version_keys():
    assert followed("champion") and followed("models:/m@champion")
    assert not followed("bundled") and not followed("models:/m/3") and not followed(None) and not followed("/models/x")
    assert key_of(Versioned(7)) == "7" and key_of(FixedDifficulty(0.1)) is None


def test_key_ring_roles_and_constant_time_identify():
    ring = KeyRing.parse("edge=gateway-key-1, gateway-key-2", "ops=admin-key-01")
    assert ring.enabled and ring.counts() == {"gateway": 2, "telemetry": 0, "admin": 1}
    assert ring.identify("gateway-key-1").key_id == "edge" and ring.identify("admin-key-01").role == "admin"
    anonymous = ring.identify("gateway-key-2")
    assert anonymous.role == "gateway" and anonymous.key_id.startswith("key-")
    assert ring.identify("gateway-key-") is None and ring.identify("") is None
    assert not KeyRing.parse(None, "").enabled
    for gateway, admin, message in [("a=x", None, "at least 8"), ("a=12345678,a=abcdefgh", None, "used twice"),
                                    ("12345678,", None, "entry 2 is empty")]:
        with pytest.raises(ValueError, match=message):
            KeyRing.parse(gateway, admin)


def test_estimator_budget_defaults_to_50_ms_and_none_disables_it(monkeypatch):
    from pointsman.service.settings import Settings

    monkeypatch.delenv("POINTSMAN_ESTIMATOR_TIMEOUT_MS", raising=False)
    assert Settings().estimator_timeout_ms == 50.0
    monkeypatch.setenv("POINTSMAN_ESTIMATOR_TIMEOUT_MS", "none")
    assert Settings().estimator_timeout_ms is None
    monkeypatch.setenv("POINTSMAN_ESTIMATOR_TIMEOUT_MS", "0")
    with pytest.raises(ValueError):
        Settings()


def test_query_token_ids_reach_the_estimator_through_the_deadline():
    """The engine tokenizes the prompt once and hands the query's ids through the
    ``DeadlineEstimator`` to an estimator that takes them; the estimate equals tokenizing again."""
    from pointsman.estimator.model_source import load_estimator

    real = load_estimator("bundled")
    seen: list[object] = []

    class Recording:
        version, tokenizer, takes_query_token_ids = real.version, real.tokenizer, True

        def estimate(self, features, query_token_ids=None):
            seen.append(query_token_ids)
            return real.estimate(features, query_token_ids)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        wrapped = DeadlineEstimator(Recording(), 5000, pool)
        assert wrapped.takes_query_token_ids
        fleet = load_fleet()
        engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), wrapped)
        prompt = "Explain how a KV cache speeds up decode, step by step. " * 60  # ~3,300 chars: windowed
        decision = engine.route(request_from_prompt(prompt), dispatch=False)
    finally:
        pool.shutdown()
    features = decision.request_features
    assert seen == [real.tokenizer.encode(features.query_text, add_special_tokens=False).ids]
    again = real.estimate(features)
    assert decision.p_hard == again.p_hard and (decision.head_input == again.features).all()


def test_serving_app_freezes_its_startup_heap(tmp_path):
    """``create_app(freeze=True)`` (what ``pointsman serve`` runs) moves the loaded objects out of
    the garbage collector's full collections once started; the default app leaves the heap alone."""
    import asyncio
    import gc

    from pointsman.service.app import create_app
    from pointsman.service.settings import Settings

    fleet = load_fleet()

    async def frozen_after_start(freeze: bool) -> int:
        engine = RoutingEngine(fleet, load_policy(STATIC_POLICY_PATH, fleet), FixedDifficulty(0.3))
        app = create_app(Settings(data_dir=tmp_path, watch_policy=False, model_poll_interval_s=0), engine,
                         freeze=freeze)
        async with app.router.lifespan_context(app):
            return gc.get_freeze_count()

    gc.unfreeze()
    try:
        assert asyncio.run(frozen_after_start(False)) == 0
        assert asyncio.run(frozen_after_start(True)) > 10_000
    finally:
        gc.unfreeze()
