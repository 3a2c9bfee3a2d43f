"""A hard time budget for the difficulty estimator: ``DeadlineEstimator``.

The onnxruntime estimator checks its budget only after it returns; an estimator that
hangs (a stuck model download, a pathological input, an overloaded host) would hold
the decision with it. ``DeadlineEstimator(inner, timeout_ms, executor)`` runs
``inner.estimate`` on a small thread pool and waits at most ``timeout_ms``: past it the
estimate is unavailable (``error`` starts with ``timeout:``), the engine decides with
``difficulty.available == false`` (the policy's rule for that case) and the trace's
``estimator`` section says why. The late estimate is discarded when it finishes.
``estimate_async`` is the same for a caller on an event loop: it awaits the pool instead of
blocking the loop (``routes_decisions.route_async``).

An estimator whose ``bounded_cost`` is true (the static encoder: arithmetic over a bounded window, no
I/O; ``DifficultyEstimator.bounded_cost``) cannot hang, so it is called on the caller's thread
instead: the hand-off to a pool thread and back cost more CPU than such an estimate's variance
(issue 24: 0.06 ms of CPU a decision at 20 words, 0.14 at 500 tokens, ``scripts/bench_decision.py``).

At most ``executor``'s worker count estimates run at once; when every worker is stuck,
new estimates wait in its queue, time out, and are cancelled there, so a hung estimator
costs each decision at most ``timeout_ms`` and never grows a backlog.

The service's executor is an ``EstimatorPool`` (``estimator_pool``): a fixed set of threads on one
queue whose ``post`` hands an estimate to a thread and its answer back to the event loop directly
(``loop.call_soon_threadsafe``), without ``concurrent.futures`` futures, ``asyncio.wrap_future`` and
``asyncio.timeout`` (``scripts/bench_decision.py``; ``docs/architecture.md``), and the worker that
went idle last takes the next estimate. Any other ``Executor`` works too.

Everything else (``version``, ``tokenizer``, ``takes_query_token_ids``, ``feature_vector``,
``model_dir``, ``manifest``, ``source``) is the inner estimator's, so the outcome log and the health
endpoints see the real model.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pointsman.estimator.estimate import DifficultyEstimate, Estimator, TokenIdsEstimator

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Tokenizer

    from pointsman.estimator.features import RequestFeatures

#: Threads estimating at once (each onnxruntime call is short; more only helps a hung model).
DEFAULT_WORKERS = 4


#: A queued job: (function, arguments, the caller's future or None, the loop and the waiter of a ``post``).
_Job = tuple[Callable[..., Any], tuple[Any, ...], "concurrent.futures.Future[Any] | None",
             "asyncio.AbstractEventLoop | None", "asyncio.Future[Any] | None"]


def _deliver(waiter: asyncio.Future[Any], value: Any, ok: bool) -> None:
    """On the waiter's loop: its result (``ok``) or exception, unless it was cancelled or timed out meanwhile."""
    if not waiter.done():
        if ok:
            waiter.set_result(value)
        else:
            waiter.set_exception(value)


class EstimatorPool(concurrent.futures.Executor):
    """``workers`` daemon threads (named ``{name}_{i}``) running jobs from one queue, in order. A new job
    wakes the worker that went idle last (its caches are the warmest; a shared queue's waiters take
    turns, so each estimate ran on the coldest thread).

    ``submit(fn, *args)`` returns a ``concurrent.futures.Future`` (as ``ThreadPoolExecutor``);
    ``post(loop, fn, *args)`` returns an ``asyncio.Future`` of ``loop`` that a worker completes
    through ``loop.call_soon_threadsafe``: a job whose future is cancelled (or done) before a worker
    takes it does not run. Both raise ``RuntimeError`` after ``shutdown``."""

    def __init__(self, workers: int = DEFAULT_WORKERS, name: str = "pointsman-estimator") -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers!r}")
        self._jobs: collections.deque[_Job] = collections.deque()
        #: Idle workers' wake-up locks (held while idle), the last to go idle last.
        self._idle: list[threading.Lock] = []
        self._lock = threading.Lock()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    def _put(self, job: _Job) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._jobs.append(job)
            if self._idle:
                self._idle.pop().release()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """Run ``fn(*args, **kwargs)`` on a worker; its future. Raises ``RuntimeError`` after ``shutdown``."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._put(((lambda: fn(*args, **kwargs)) if kwargs else fn, args if not kwargs else (), future, None, None))
        return future

    def post(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], /, *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` on a worker; an ``asyncio.Future`` of ``loop`` (call on ``loop``'s thread) with its
        result or exception. Cancel it to drop the job if no worker took it yet. Raises ``RuntimeError``
        after ``shutdown``."""
        waiter = loop.create_future()
        self._put((fn, args, None, loop, waiter))
        return waiter

    def _work(self) -> None:
        wake = threading.Lock()
        wake.acquire()  # held while working; released by ``_put`` or ``shutdown`` to wake this worker
        while True:
            with self._lock:
                job = self._jobs.popleft() if self._jobs else None
                if job is None:
                    if self._closed:
                        return
                    self._idle.append(wake)
            if job is None:
                wake.acquire()
                continue
            self._run(*job)
            del job  # not kept alive while waiting for the next

    @staticmethod
    def _run(fn: Callable[..., Any], args: tuple[Any, ...], future: concurrent.futures.Future[Any] | None,
             loop: asyncio.AbstractEventLoop | None, waiter: asyncio.Future[Any] | None) -> None:
        if future is not None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, as ThreadPoolExecutor does
                future.set_exception(exc)
            else:
                future.set_result(result)
            return
        if loop is None or waiter is None or waiter.done():  # cancelled or timed out while queued
            return
        try:
            value, ok = fn(*args), True
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            value, ok = exc, False
        try:
            loop.call_soon_threadsafe(_deliver, waiter, value, ok)
        except RuntimeError:  # the loop closed meanwhile: nobody waits
            pass

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new jobs; with ``cancel_futures`` the queued ones are cancelled (their futures and waiters);
        the workers end after the jobs left. ``wait``: until they have."""
        with self._lock:
            self._closed = True
            while cancel_futures and self._jobs:
                _, _, future, loop, waiter = self._jobs.popleft()
                if future is not None:
                    future.cancel()
                elif loop is not None and waiter is not None:
                    try:
                        loop.call_soon_threadsafe(waiter.cancel)
                    except RuntimeError:  # the loop is closed: nobody waits
                        pass
            while self._idle:
                self._idle.pop().release()
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()


def estimator_pool(workers: int = DEFAULT_WORKERS) -> EstimatorPool:
    """The thread pool ``DeadlineEstimator``s run on (one per service process)."""
    return EstimatorPool(workers, "pointsman-estimator")


def _pool_unavailable(exc: RuntimeError) -> DifficultyEstimate:
    """The unavailable estimate when the pool refuses a job (shut down: the service stopping)."""
    return DifficultyEstimate(None, False, 0.0, f"estimator pool unavailable: {exc}")


def _expire(waiter: asyncio.Future[Any], expired: list[bool]) -> None:
    """``estimate_async``'s deadline: mark and cancel the wait (the job is dropped if still queued)."""
    if not waiter.done():
        expired.append(True)
        waiter.cancel()


class DeadlineEstimator:
    """``inner`` with a hard wall-clock budget of ``timeout_ms`` per estimate (see the module).

    ``estimate(features) -> DifficultyEstimate`` never raises and returns within about
    ``timeout_ms`` (plus thread hand-off, tens of microseconds), or, ``inline``, within the inner
    estimator's bounded cost; an exception of ``inner`` comes back as unavailable with its text."""

    def __init__(self, inner: Estimator, timeout_ms: float, executor: concurrent.futures.Executor) -> None:
        if not timeout_ms > 0:
            raise ValueError(f"timeout_ms must be > 0, got {timeout_ms!r}")
        self.inner = inner
        #: ``inner`` when it can take query token ids (checked once; ``inner`` never changes).
        self._takes_ids: TokenIdsEstimator | None = inner if isinstance(inner, TokenIdsEstimator) else None
        self.timeout_ms = float(timeout_ms)
        self._executor = executor
        #: Whether estimates run on the caller's thread (``inner.bounded_cost``; see the module).
        self.inline: bool = bool(getattr(inner, "bounded_cost", False))

    @property
    def version(self) -> str:
        """The inner estimator's version."""
        return str(self.inner.version)

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The inner estimator's tokenizer (None if it has none)."""
        return self.inner.tokenizer

    @property
    def takes_query_token_ids(self) -> bool:
        """Whether the inner estimator's ``estimate`` takes ``query_token_ids``."""
        return bool(getattr(self.inner, "takes_query_token_ids", False))

    def __getattr__(self, name: str) -> object:
        if name == "inner":  # not set yet (during unpickling); never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _submit(self, features: RequestFeatures, query_token_ids: list[int] | None
                ) -> concurrent.futures.Future[DifficultyEstimate] | DifficultyEstimate:
        """The inner estimate submitted to the pool, or the unavailable estimate when the pool is shut
        down (the service stopping)."""
        fn, args = self._call(features, query_token_ids)
        try:
            return self._executor.submit(fn, *args)
        except RuntimeError as exc:
            return _pool_unavailable(exc)

    def _call(self, features: RequestFeatures, query_token_ids: list[int] | None
              ) -> tuple[Callable[..., DifficultyEstimate], tuple[Any, ...]]:
        """The inner estimator's call for these inputs: (function, arguments); the window's token ids only
        to an estimator that takes them."""
        if query_token_ids is None or self._takes_ids is None:
            return self.inner.estimate, (features,)
        return self._takes_ids.estimate, (features, query_token_ids)

    def estimate(self, features: RequestFeatures, query_token_ids: list[int] | None = None) -> DifficultyEstimate:
        """The inner estimate, or unavailable with ``timeout: ...`` once ``timeout_ms`` passed.
        ``query_token_ids`` go to the inner estimator when given and it takes them (see
        ``takes_query_token_ids``)."""
        if self.inline:
            return self._inline(features, query_token_ids)
        started = time.perf_counter()
        future = self._submit(features, query_token_ids)
        if isinstance(future, DifficultyEstimate):
            return future
        try:
            return future.result(timeout=self.timeout_ms / 1000.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return self._late(started)
        except Exception as exc:  # noqa: BLE001 - an estimator must never take a decision down
            elapsed = (time.perf_counter() - started) * 1000.0
            return DifficultyEstimate(None, False, elapsed, f"{type(exc).__name__}: {exc}")

    async def estimate_async(self, features: RequestFeatures,
                             query_token_ids: list[int] | None = None) -> DifficultyEstimate:
        """``estimate`` awaited on an event loop instead of blocking it: the loop serves other
        requests while the pool estimates (the blocking wait held the loop for the estimate and the
        threads' hand-offs, ~50% of its time at saturation: issue 24). The same answers. The wait
        ends at the deadline (a timer on the loop; the job is dropped if no worker took it yet);
        cancelling the caller cancels the wait as well. An estimator of bounded cost is called on the loop
        (``inline``)."""
        if self.inline:
            return self._inline(features, query_token_ids)
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        fn, args = self._call(features, query_token_ids)
        try:
            if isinstance(self._executor, EstimatorPool):
                waiter = self._executor.post(loop, fn, *args)
            else:
                waiter = asyncio.wrap_future(self._executor.submit(fn, *args), loop=loop)
        except RuntimeError as exc:
            return _pool_unavailable(exc)
        expired: list[bool] = []
        deadline = loop.call_later(self.timeout_ms / 1000.0, _expire, waiter, expired)
        try:
            estimate: DifficultyEstimate = await waiter
            return estimate
        except asyncio.CancelledError:
            if not expired:  # the caller was cancelled
                raise
            return self._late(started)
        except Exception as exc:  # noqa: BLE001 - an estimator must never take a decision down
            elapsed = (time.perf_counter() - started) * 1000.0
            return DifficultyEstimate(None, False, elapsed, f"{type(exc).__name__}: {exc}")
        finally:
            deadline.cancel()

    def _inline(self, features: RequestFeatures, query_token_ids: list[int] | None) -> DifficultyEstimate:
        """The inner estimate on this thread (``inline``); an exception comes back as unavailable."""
        started = time.perf_counter()
        fn, args = self._call(features, query_token_ids)
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - an estimator must never take a decision down
            elapsed = (time.perf_counter() - started) * 1000.0
            return DifficultyEstimate(None, False, elapsed, f"{type(exc).__name__}: {exc}")

    def _late(self, started: float) -> DifficultyEstimate:
        """The unavailable estimate of one that did not come within the budget."""
        elapsed = (time.perf_counter() - started) * 1000.0
        return DifficultyEstimate(None, False, elapsed, f"timeout: no estimate within the {self.timeout_ms:g} ms "
                                                        f"budget (waited {elapsed:.1f} ms)")

    def __repr__(self) -> str:
        return f"DeadlineEstimator({self.inner!r}, timeout_ms={self.timeout_ms:g})"
