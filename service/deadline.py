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

At most ``executor``'s worker count estimates run at once; when every worker is stuck,
new estimates wait in its queue, time out, and are cancelled there, so a hung estimator
costs each decision at most ``timeout_ms`` and never grows a backlog.

Everything else (``version``, ``tokenizer``, ``takes_query_token_ids``, ``feature_vector``,
``model_dir``, ``manifest``, ``source``) is the inner estimator's, so the outcome log and the health
endpoints see the real model.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import TYPE_CHECKING

from pointsman.estimator.estimate import DifficultyEstimate, Estimator, TokenIdsEstimator

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Tokenizer

    from pointsman.estimator.features import RequestFeatures

#: Threads estimating at once (each onnxruntime call is short; more only helps a hung model).
DEFAULT_WORKERS = 4


def estimator_pool(workers: int = DEFAULT_WORKERS) -> concurrent.futures.ThreadPoolExecutor:
    """The thread pool ``DeadlineEstimator``s run on (one per service process)."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pointsman-estimator")


class DeadlineEstimator:
    """``inner`` with a hard wall-clock budget of ``timeout_ms`` per estimate (see the module).

    ``estimate(features) -> DifficultyEstimate`` never raises and returns within about
    ``timeout_ms`` (plus thread hand-off, tens of microseconds); an exception of ``inner``
    comes back as unavailable with its text."""

    def __init__(self, inner: Estimator, timeout_ms: float, executor: concurrent.futures.Executor) -> None:
        if not timeout_ms > 0:
            raise ValueError(f"timeout_ms must be > 0, got {timeout_ms!r}")
        self.inner = inner
        #: ``inner`` when it can take query token ids (checked once; ``inner`` never changes).
        self._takes_ids: TokenIdsEstimator | None = inner if isinstance(inner, TokenIdsEstimator) else None
        self.timeout_ms = float(timeout_ms)
        self._executor = executor

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
        try:
            if query_token_ids is None or self._takes_ids is None:
                return self._executor.submit(self.inner.estimate, features)
            return self._executor.submit(self._takes_ids.estimate, features, query_token_ids)
        except RuntimeError as exc:
            return DifficultyEstimate(None, False, 0.0, f"estimator pool unavailable: {exc}")

    def estimate(self, features: RequestFeatures, query_token_ids: list[int] | None = None) -> DifficultyEstimate:
        """The inner estimate, or unavailable with ``timeout: ...`` once ``timeout_ms`` passed.
        ``query_token_ids`` go to the inner estimator when given and it takes them (see
        ``takes_query_token_ids``)."""
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
        threads' hand-offs, ~50% of its time at saturation: issue 24). The same answers."""
        started = time.perf_counter()
        future = self._submit(features, query_token_ids)
        if isinstance(future, DifficultyEstimate):
            return future
        try:
            async with asyncio.timeout(self.timeout_ms / 1000.0):
                return await asyncio.wrap_future(future)
        except TimeoutError:
            future.cancel()
            return self._late(started)
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
