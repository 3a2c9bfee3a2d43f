"""The cascade's service side: the decisions a gateway may still verify, and the wire schemas
of ``POST /v1/verify`` (``routes_verify.py``).

``PendingDrafts`` holds, per decision this process answered while its policy had a ``verify``
section, what a verify needs (the ``Decision`` with its request view) for ``ttl_s`` seconds,
at most ``max_entries`` of them holding at most ``max_bytes`` of request text (``held_bytes``; the
oldest forgotten first: a verify of a forgotten decision is 410, and the gateway keeps its draft;
an escalation is then read from the outcome log, which logged it), and each decision's first
verify answer (a repeated verify replays it) and escalation (the gateway's outcome settles
it). Another process sharing the state relays a verify here (``verify_relay.py``); without
shared state a verify must reach the process that made the decision (elsewhere: 410). Thread-safe.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from pointsman.estimator.draft import Draft
from pointsman.json_types import JSONBool
from pointsman.outcome import ID_PATTERN, Usage
from pointsman.policy.decision import Decision
from pointsman.service.schemas import EndpointOut, FallbackOut

#: Largest draft text accepted (characters) and most log-probabilities.
MAX_DRAFT_TEXT_CHARS = 1_000_000
MAX_DRAFT_LOGPROBS = 100_000


class DraftIn(BaseModel):
    """The draft: ``text`` (the answer or its first tokens), ``finish_reason`` (the engine's;
    omit while streaming), ``logprobs`` (token log-probabilities, each in [-10000, 0], when the
    engine returned them), ``partial`` (only the first tokens so far)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    text: str = Field(default="", max_length=MAX_DRAFT_TEXT_CHARS)
    finish_reason: str | None = Field(default=None, max_length=64)
    logprobs: list[Annotated[float, Field(ge=-1e4, le=0.0)]] | None = Field(default=None, max_length=MAX_DRAFT_LOGPROBS)
    partial: JSONBool = False


class VerifyIn(BaseModel):
    """``POST /v1/verify``'s body: the ``decision_id`` the draft answers, the ``draft``, the
    draft call's ``usage`` (any shape of ``pointsman/usage_shapes.py``; ``completion_tokens`` counts the draft)
    and ``served_target``, the target that wrote the draft when it is not the decision's (a fallback
    answered), as an outcome's: the draft is priced and judged as that target's."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    decision_id: str = Field(pattern=ID_PATTERN)
    draft: DraftIn
    usage: Usage | None = None
    served_target: str | None = Field(default=None, max_length=128)

    def as_draft(self) -> Draft:
        """The estimator's ``Draft``."""
        u = self.usage
        tokens = u.completion_tokens if u is not None else None
        return Draft(text=self.draft.text, finish_reason=self.draft.finish_reason or "",
                     logprobs=tuple(self.draft.logprobs or ()), completion_tokens=tokens, partial=self.draft.partial)


class VerifyOut(BaseModel):
    """The answer: ``action`` (``accept``: keep the draft; ``escalate``: call ``target`` at
    ``base_url`` with ``model``, trying ``fallbacks`` next, and report the outcome under the
    decision id), ``p_bad`` (the verifier's probability that the draft loses to the frontier),
    ``verifier``, the deciding ``rule`` and its ``labels``, ``escalation_id`` (what the frontier
    call's budget hold and load are held under), ``estimated_cost_usd`` of the escalation,
    ``draft`` (its features), ``draft_settlement`` (the draft's booked cost, or why not),
    ``replayed`` (this is the first answer again) and a ``trace`` (every verify rule's result)."""

    decision_id: str
    action: Literal["accept", "escalate"]
    p_bad: float
    verifier: str
    rule: str
    labels: dict[str, str]
    escalation_id: str | None
    target: str | None
    model: str | None
    base_url: str | None
    mode: str | None
    endpoints: list[EndpointOut]
    fallbacks: list[FallbackOut]
    estimated_cost_usd: float | None
    draft: dict[str, object]
    draft_settlement: dict[str, object] | None
    replayed: bool
    trace: dict[str, object]


@dataclass
class Pending:
    """One verifiable decision: the ``decision``, when it was made (monotonic s), the first
    verify ``answer`` (None until verified), the escalation (``escalation_id``, ``target``), the target
    that wrote the verified draft (``drafted``: the decision's, or the fallback the verify named) and
    a lock that serializes verifies of this decision."""

    decision: Decision
    made_mono: float
    held_bytes: int = 0
    answer: dict[str, object] | None = None
    escalation: tuple[str, str] | None = None
    drafted: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)



def held_bytes(decision: Decision) -> int:
    """Bytes of request text ``decision`` keeps alive through its request view: each message text's
    ``str`` (1, 2 or 4 bytes a character, as CPython stores it) and its UTF-8 (``RequestView.utf8``, which
    the route path encodes and the view keeps); 0 without a view."""
    view = decision.request_view
    if view is None:
        return 0
    try:
        utf8 = sum(map(len, view.utf8))
    except UnicodeEncodeError:  # a lone surrogate (parse_route_request refuses them): at most 4 bytes a character
        utf8 = 4 * sum(map(len, view.texts))
    return sum(map(sys.getsizeof, view.texts)) + utf8

class PendingDrafts:
    """Decisions that may still be verified (see the module). ``PendingDrafts(ttl_s, max_entries,
    max_bytes)``: ``max_bytes`` bounds the memory of the request text held (``held_bytes``: the messages'
    texts and their UTF-8), so memory stays bounded whatever the prompts' length and script (100,000
    decisions of 100k-token prompts held for the TTL would be tens of GB; a character is 1 to 4 bytes
    in each form)."""

    def __init__(self, ttl_s: float = 600.0, max_entries: int = 100_000, max_bytes: int = 512 * 2**20) -> None:
        self.ttl_s, self.max_entries, self.max_bytes = float(ttl_s), int(max_entries), int(max_bytes)
        self._items: OrderedDict[str, Pending] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def add(self, decision: Decision, now_mono: float | None = None) -> None:
        """Hold ``decision`` for verification, forgetting the oldest held decisions while one is past
        ``ttl_s`` or the held ones exceed ``max_entries`` or ``max_bytes`` (this one is kept)."""
        now = time.monotonic() if now_mono is None else now_mono
        size = held_bytes(decision)
        with self._lock:
            old = self._items.pop(decision.decision_id, None)
            if old is not None:
                self._bytes -= old.held_bytes
            self._items[decision.decision_id] = Pending(decision, now, size)
            self._bytes += size
            while len(self._items) > 1:
                first = next(iter(self._items.values()))
                if now - first.made_mono <= self.ttl_s and len(self._items) <= self.max_entries \
                        and self._bytes <= self.max_bytes:
                    break
                self._items.popitem(last=False)
                self._bytes -= first.held_bytes

    def get(self, decision_id: str, now_mono: float | None = None) -> Pending | None:
        """The pending decision, or None when unknown here or older than ``ttl_s`` (then forgotten,
        unless it was escalated: its escalation is kept until ``add`` forgets it, after ``ttl_s`` too; the outcome
        log has it then)."""
        now = time.monotonic() if now_mono is None else now_mono
        with self._lock:
            item = self._items.get(decision_id)
            if item is None or now - item.made_mono <= self.ttl_s:
                return item
            if item.escalation is None:
                del self._items[decision_id]
                self._bytes -= item.held_bytes
            return None

    def escalation_of(self, decision_id: str) -> tuple[str, str] | None:
        """(escalation id, target) of an escalated decision held here, else None."""
        with self._lock:
            item = self._items.get(decision_id)
        return None if item is None else item.escalation

    def drafted(self, decision_id: str) -> str | None:
        """The target that wrote the verified draft of a decision held here, else None."""
        with self._lock:
            item = self._items.get(decision_id)
        return None if item is None else item.drafted

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


__all__ = ["DraftIn", "Pending", "PendingDrafts", "VerifyIn", "VerifyOut"]
