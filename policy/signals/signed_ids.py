"""Signed decision ids: the id itself carries what settling its outcome needs, so any replica
(or worker) settles an outcome without the shared state or the decision log.

A dispatched decision's id reads ``<base>.<claims>.<mac>``:

- ``base``: 32 hex, the first 12 a millisecond Unix timestamp (ids sort by time), the rest random;
- ``claims``: base64url (no padding) of compact JSON: ``t`` target, ``m`` mode, ``s`` budget
  scopes, ``e`` estimated cost in USD, ``pu``/``du`` the prefill/decode utilizations the estimate
  used, ``i`` the inbox (outcome log id) of the process that logs the decision, ``p`` the prompt
  tokens the estimate counted (what an outcome without usage is priced on; 0 in older ids);
- ``mac``: base64url of the first 12 bytes of HMAC-SHA256(key, ``base.claims``). Every replica
  holds the same key (``service/decision_key.py`` says where it comes from), so a forged or
  altered id does not verify and is ``unknown_decision``.

An escalation's id (``POST /v1/verify`` escalated the decision: ``policy/escalation.py``) is
signed too, so any replica settles the escalated call's outcome: ``<decision id>/escalation.<claims>.<mac>``,
the claims the escalation's own (``t``, ``m``, ``e``, ``pu``, ``du`` and ``ts``, the Unix time of
its hold in ms), the MAC over everything before it; its scopes and inbox are those of the
decision id it carries, which must verify too. ``Claims.escalates`` names that decision.

The claims are readable by whoever sees the id (gateways, engines' logs): scopes name tenants,
teams and API key ids (never a secret), in UTF-8. Typical length 150-250 characters; at most
``MAX_ID_CHARS`` (``pointsman.outcome``: 8,192; ids are checked to that length everywhere), which the
longest claims fit: three 200-character scope names are about 5,300 characters of id.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass

from pointsman.outcome import MAX_ID_CHARS

#: Bytes of the HMAC-SHA256 kept in an id (96 bits).
MAC_BYTES = 12
#: The claims' compact JSON (``json.dumps(..., separators=(",", ":"))``'s encoder, built once).
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Claims:
    """What a signed id says about its decision: ``target``, ``mode``, budget ``scopes``,
    ``estimated_cost_usd``, the utilizations its estimate used, ``issued_s`` (Unix seconds, from the
    id's timestamp: the budget windows a settlement books into), ``inbox`` ('' for none), for an
    escalation's id ``escalates``: the decision id it escalates, ``prompt_tokens`` the estimate
    counted and ``output_cap_tokens`` the client's output cap it assumed (``max_tokens`` x ``n``; the
    decision's, for an escalation; 0 when the id does not say, or no cap) and ``fleet_revision``, the
    revision of the fleet whose prices it was made at ('' when the id does not say)."""

    target: str
    mode: str
    scopes: tuple[str, ...]
    estimated_cost_usd: float
    prefill_utilization: float
    decode_utilization: float
    issued_s: float
    inbox: str
    escalates: str = ""  # an escalation's claims: the decision id it escalates ('' for a decision)
    prompt_tokens: int = 0
    output_cap_tokens: int = 0
    fleet_revision: str = ""


#: What an escalation id's part before its claims ends with (``policy.escalation.escalation_id``).
ESCALATION_SUFFIX = "/escalation"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class DecisionSigner:
    """Signs and verifies decision ids with one shared ``key`` (bytes, at least 16).
    Thread-safe (its keyed HMAC state is only ever copied). Raises ``ValueError`` for a short key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a decision signing key needs at least 16 bytes")
        self._key = bytes(key)
        self._keyed = hmac.new(self._key, digestmod=hashlib.sha256)  # never updated: only copied

    def _mac(self, signed: str) -> str:
        mac = self._keyed.copy()  # the key's pads hashed once (``__init__``): ~30% of an HMAC's cost
        mac.update(signed.encode())
        return _b64(mac.digest()[:MAC_BYTES])

    def sign(self, base_id: str, *, target: str, mode: str, scopes: tuple[str, ...], estimated_cost_usd: float,
             prefill_utilization: float, decode_utilization: float, inbox: str, prompt_tokens: int = 0,
             output_cap_tokens: int = 0, fleet_revision: str = "") -> str:
        """The signed id of ``base_id`` (``decision.new_decision_id()``) with these claims."""
        payload = {"t": target, "m": mode, "s": list(scopes), "e": estimated_cost_usd, "pu": prefill_utilization,
                   "du": decode_utilization, "i": inbox, "p": int(prompt_tokens)}
        if output_cap_tokens:
            payload["o"] = int(output_cap_tokens)
        if fleet_revision:
            payload["f"] = fleet_revision
        signed = f"{base_id}.{_b64(_COMPACT.encode(payload).encode())}"
        return f"{signed}.{self._mac(signed)}"

    def sign_escalation(self, decision_id: str, *, target: str, mode: str, estimated_cost_usd: float,
                        prefill_utilization: float, decode_utilization: float, issued_s: float,
                        fleet_revision: str = "") -> str:
        """The signed id of the escalation of ``decision_id`` (itself a signed id) with these claims
        (``issued_s``: Unix seconds of its hold)."""
        payload = {"t": target, "m": mode, "e": estimated_cost_usd, "pu": prefill_utilization,
                   "du": decode_utilization, "ts": int(issued_s * 1000)}
        if fleet_revision:
            payload["f"] = fleet_revision
        signed = f"{decision_id}{ESCALATION_SUFFIX}.{_b64(_COMPACT.encode(payload).encode())}"
        return f"{signed}.{self._mac(signed)}"

    def verify(self, decision_id: str) -> Claims | None:
        """The claims of a genuine signed id, a decision's or an escalation's; None for anything else
        (an unsigned id, a wrong signature, a malformed payload). Never raises."""
        if ESCALATION_SUFFIX + "." in decision_id:
            return self._verify_escalation(decision_id)
        parts = decision_id.split(".")
        if len(parts) != 3 or len(decision_id) > MAX_ID_CHARS or len(parts[0]) != 32:
            return None
        signed = f"{parts[0]}.{parts[1]}"
        if not hmac.compare_digest(self._mac(signed), parts[2]):
            return None
        try:
            data = json.loads(_unb64(parts[1]))
            return Claims(str(data["t"]), str(data["m"]), tuple(str(s) for s in data["s"]), float(data["e"]),
                          float(data["pu"]), float(data["du"]), int(parts[0][:12], 16) / 1000.0, str(data["i"]),
                          prompt_tokens=max(0, int(data.get("p", 0))),
                          output_cap_tokens=max(0, int(data.get("o", 0))), fleet_revision=str(data.get("f", "")))
        except (ValueError, KeyError, TypeError):
            return None

    def _verify_escalation(self, escalation_id: str) -> Claims | None:
        head, sep, mac = escalation_id.rpartition(".")
        prefix, _, claims = head.rpartition(".")
        if not sep or len(escalation_id) > MAX_ID_CHARS or not prefix.endswith(ESCALATION_SUFFIX) \
                or not hmac.compare_digest(self._mac(head), mac):
            return None
        decision = self.verify(prefix.removesuffix(ESCALATION_SUFFIX))
        if decision is None or decision.escalates:
            return None
        try:
            data = json.loads(_unb64(claims))
            return Claims(str(data["t"]), str(data["m"]), decision.scopes, float(data["e"]), float(data["pu"]),
                          float(data["du"]), int(data["ts"]) / 1000.0, decision.inbox,
                          prefix.removesuffix(ESCALATION_SUFFIX), prompt_tokens=decision.prompt_tokens,
                          output_cap_tokens=decision.output_cap_tokens, fleet_revision=str(data.get("f", "")))
        except (ValueError, KeyError, TypeError):
            return None


__all__ = ["ESCALATION_SUFFIX", "MAX_ID_CHARS", "Claims", "DecisionSigner"]
