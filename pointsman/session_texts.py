"""The last text of each long conversation, kept once for the things its next turn reuses from it.

A conversation's next turn repeats its previous text and adds to it. ``SessionTexts`` keeps per session the
last text's UTF-8 (``RequestView.conversation_utf8``) with its prefix block hashes
(``policy.signals.prefix_index``), its class units (``estimator.token_bounds``) and its byte-class counts
(``estimator.billed_tokens``) beside it, and each consumer computes only past where the new text agrees with
the kept one, checked byte for byte: the hashes of the blocks inside the common prefix are reused (block *i*'s
hash covers every block before it) and the chain goes on; the counts are reused when the new text starts with
the counted one, which ends with a newline (a newline ends every run, so ``a + b`` counts what ``a`` and ``b``
do; the byte-class counts also need ``b`` not to start with a newline). Results never depend on what was kept
(``tests/test_session_texts.py``). Whichever consumer keeps a new text first replaces the kept one and carries
over what of the other's result still holds. Thread-safe: one lock around the look-up and the keeping, the
comparing and computing outside it (the service does both on the event loop, ``RoutingEngine.prepare`` and
``route``; other callers of the engine may use threads).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

import numpy as np

#: Shortest text kept (bytes; 64 of the prefix index's 512-byte text blocks): shorter ones cost less to
#: hash and count than to look up.
MIN_BYTES = 32 * 1024
#: Most bytes of texts kept (the least recently used dropped first): ~160 conversations of 100k tokens.
MAX_BYTES = 64 << 20

#: An additive count (``SessionTexts.units``, ``SessionTexts.billed``).
T = TypeVar("T", int, np.ndarray)
#: ``chain(data, block_bytes, root, start, parent)``: the chained hashes of ``data``'s full blocks from block
#: ``start`` on, ``parent`` being block ``start - 1``'s hash (None: from ``root``).
Chain = Callable[[bytes, int, int, int, int | None], list[int]]


@dataclass(frozen=True, slots=True)
class _Kept:
    """A kept text: ``data``; ``chain``: (root, block bytes, hashes of ``data``'s first blocks); ``units``:
    (n, class units of ``data[:n]``); ``billed``: (n, ``billed_tokens`` byte-class counts of ``data[:n]``)."""

    data: bytes
    chain: tuple[int, int, list[int]] | None = None
    units: tuple[int, int] | None = None
    billed: tuple[int, np.ndarray] | None = None


def common_prefix(a: bytes, b: bytes) -> int:
    """Bytes ``a`` and ``b`` have in common from the start (a memcmp when one extends the other)."""
    if b.startswith(a):
        return len(a)
    n = min(len(a), len(b))
    if a.startswith(b):
        return n
    diff = np.frombuffer(a, np.uint8, count=n) != np.frombuffer(b, np.uint8, count=n)
    return int(np.argmax(diff))


class SessionTexts:
    """The last text per key (the caller's session, else the text's first KiB) with its block hashes and
    class units (see the module). Texts under ``min_bytes`` are computed, not kept; ``max_bytes`` bounds the
    bytes of texts kept (least recently used dropped first). A text that is a strict prefix of the kept one
    (the estimator's cut of a conversation) does not replace it."""

    def __init__(self, max_bytes: int = MAX_BYTES, min_bytes: int = MIN_BYTES) -> None:
        self.max_bytes, self.min_bytes = int(max_bytes), int(min_bytes)
        self._items: OrderedDict[object, _Kept] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def hashes(self, data: bytes, key: object, block_bytes: int, root: int, chain: Chain) -> list[int]:
        """``chain(data, block_bytes, root, 0, None)``, reusing the hashes of the blocks ``data`` shares with the
        text kept under ``key`` (None: ``data``'s first KiB)."""
        if len(data) < max(self.min_bytes, block_bytes):
            return chain(data, block_bytes, root, 0, None)
        slot, got, same = self._find(data, key)
        reused: list[int] = []
        if got is not None and got.chain is not None and got.chain[:2] == (root, block_bytes):
            reused = got.chain[2][:same // block_bytes]
        out = reused + chain(data, block_bytes, root, len(reused), reused[-1] if reused else None)
        self._keep(slot, data, got, same, _Kept(data, chain=(root, block_bytes, out)))
        return out

    def units(self, data: bytes, key: object, count: Callable[[bytes], int]) -> int:
        """``count(data)`` (the class units of UTF-8 ``data``: ``count(a + b) == count(a) + count(b)`` when
        ``a`` ends with a newline), from the count kept under ``key`` (None: ``data``'s first KiB) where it
        holds."""
        return self._additive("units", data, key, count)

    def billed(self, data: bytes, key: object, count: Callable[[bytes], np.ndarray]) -> np.ndarray:
        """``count(data)`` (``billed_tokens.byte_class_vector`` of UTF-8 ``data``: ``count(a + b) == count(a) +
        count(b)`` when ``a`` ends with a newline and ``b`` starts with none: a run of newlines is one count),
        from the counts kept under ``key`` where they hold."""
        return self._additive("billed", data, key, count, b"\n\r")

    def _additive(self, field: str, data: bytes, key: object, count: Callable[[bytes], T], not_after: bytes = b"") -> T:
        """``count(data)`` for a count that adds across a newline (not before a byte of ``not_after``), from the
        value kept in ``field``."""
        if len(data) < self.min_bytes:
            return count(data)
        slot, got, same = self._find(data, key)
        kept = cast("tuple[int, T] | None", None if got is None else getattr(got, field))
        n = -1 if kept is None else kept[0]
        if kept is not None and n <= same and (n == len(data) or (n and data[n - 1] == 10 and data[n] not in not_after)):
            value = kept[1] + count(data[n:]) if n < len(data) else kept[1]
        else:
            value = count(data)
        self._keep(slot, data, got, same, replace(_Kept(data), **cast("dict[str, Any]", {field: (len(data), value)})))
        return value

    def _find(self, data: bytes, key: object) -> tuple[object, _Kept | None, int]:
        """(the slot of ``data`` under ``key``, what it holds, bytes in common with it)."""
        slot = data[:1024] if key is None else key
        with self._lock:
            got = self._items.get(slot)
        return slot, got, 0 if got is None else common_prefix(got.data, data)

    def _keep(self, slot: object, data: bytes, got: _Kept | None, same: int, mine: _Kept) -> None:
        """Keep ``mine`` (a result for ``data``) at ``slot``, merged with what the slot holds now (``got``,
        ``same`` bytes in common with ``data``, unless another thread kept since)."""
        with self._lock:
            cur = self._items.pop(slot, None)
            if cur is not None:
                self._bytes -= len(cur.data)
                same = same if cur is got else common_prefix(cur.data, data)
                if same == len(data) < len(cur.data):  # a cut of the kept text: keep the longer one
                    mine = cur
                if mine.chain is None and cur.chain is not None:  # what of the other's result holds for data
                    root, block_bytes, hashes = cur.chain
                    mine = replace(mine, chain=(root, block_bytes, hashes[:same // block_bytes]))
                for field in ("units", "billed"):
                    theirs = getattr(cur, field)
                    if getattr(mine, field) is None and theirs is not None and theirs[0] <= same:
                        mine = replace(mine, **{field: theirs})
            if len(mine.data) <= self.max_bytes:
                self._items[slot] = mine
                self._bytes += len(mine.data)
            while self._bytes > self.max_bytes:
                self._bytes -= len(self._items.popitem(last=False)[1].data)


#: The process's ``SessionTexts`` (``prefix_index.block_hashes_from_text`` with ``reuse``, the features'
#: count of a conversation's class units).
SESSION_TEXTS = SessionTexts()
