"""Group commit: callers in several threads that each need a durable write share one commit.

``GroupCommit(commit)`` runs ``commit(calls)`` (one transaction and one ``fsync`` for every call
in the list; returns one result per call, in order) for whatever calls are queued. A call
(``run``) joins the queue; if no commit is in progress it commits the queue itself, its own call
included; otherwise it waits, and when that commit ends either its call was in it (done) or it
commits the calls queued meanwhile. So while one ``fsync`` is in flight the next callers gather
behind it and share the following one: N concurrent writers cost about two ``fsync`` each,
not N, and a lone writer commits at once (no batching delay). No thread of its own: the
committer is always a caller.

``commit`` raising fails every call of that batch with the same exception (nothing of it was
committed); the next batch is tried anew.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar, cast

C = TypeVar("C")
R = TypeVar("R")


class _Slot(Generic[C, R]):
    """One queued call and, once its batch is committed, its result or the batch's error."""

    __slots__ = ("call", "done", "error", "result")

    def __init__(self, call: C) -> None:
        self.call = call
        self.done = False
        self.result: R | None = None
        self.error: BaseException | None = None


class GroupCommit(Generic[C, R]):
    """See the module. ``commit(calls) -> results``: ``len(results) == len(calls)``. Thread-safe."""

    def __init__(self, commit: Callable[[Sequence[C]], Sequence[R]]) -> None:
        self._commit = commit
        self._cond = threading.Condition()
        self._queue: list[_Slot[C, R]] = []
        self._committing = False
        #: Batches committed and calls in them (the average batch size is calls / batches).
        self.batches = self.calls = 0

    def run(self, call: C) -> R:
        """Commit ``call`` (with whatever else is queued); its result once durable. Raises what
        ``commit`` raised for its batch."""
        slot: _Slot[C, R] = _Slot(call)
        with self._cond:
            self._queue.append(slot)
            self._cond.wait_for(lambda: slot.done or not self._committing)
            if not slot.done:
                batch, self._queue = self._queue, []
                self._committing = True
        if not slot.done:
            self._commit_batch(batch)
        if slot.error is not None:
            raise slot.error
        return cast(R, slot.result)  # set by the commit that took the slot

    def _commit_batch(self, batch: list[_Slot[C, R]]) -> None:
        results: Sequence[R] = ()
        error: BaseException | None = None
        try:
            results = self._commit([s.call for s in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"group commit returned {len(results)} results for {len(batch)} calls")
        except BaseException as exc:  # noqa: BLE001 - every caller of the batch gets it, then it propagates
            error = exc
        with self._cond:
            for i, s in enumerate(batch):
                if error is None:
                    s.result = results[i]
                else:
                    s.error = error
                s.done = True
            self.batches += 1
            self.calls += len(batch)
            self._committing = False
            self._cond.notify_all()


__all__ = ["GroupCommit"]
