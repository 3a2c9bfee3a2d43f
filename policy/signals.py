"""The signals a policy's expressions can read, and the per-decision snapshot.

The snapshot is a plain dict built once per decision, one key per namespace::

    {"request":    {"prompt_tokens": 812, "max_output_tokens": 256, "turns": 1, ...},
     "difficulty": {"p_hard": 0.41, "available": True},
     "variables":  {"p_hard_frontier": 0.62, ...}}

``SIGNALS`` declares every namespace and field with its type and meaning; the
compiler checks expressions against it (unknown names get "did you mean"), and the
reference page can be generated from it. Namespaces with open keys
(``variables``; later ``load[target]``) declare ``fields=None`` or take their
fields from the policy. Signals the policy issue adds (``load``, ``cache``,
``budget``) register here as new ``Namespace`` entries and new builders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.estimate import DifficultyEstimate
    from pointsman.estimator.features import RequestFeatures
    from pointsman.request import RouteRequest


@dataclass(frozen=True)
class Signal:
    """One field of a namespace: CEL ``type`` (int, double, bool, string, null_type) and its meaning."""

    type: str
    doc: str
    nullable: bool = False


@dataclass(frozen=True)
class Namespace:
    """A root name visible to expressions; ``fields`` None means open keys (checked elsewhere)."""

    name: str
    doc: str
    fields: dict[str, Signal] | None


SIGNALS: dict[str, Namespace] = {
    "request": Namespace("request", "Facts about the request, computed before routing.", {
        "prompt_tokens": Signal("int", "prompt length in tokens (exact when the gateway sends routing.prompt_tokens, "
                                       "else counted on a bounded sample and extrapolated)"),
        "max_output_tokens": Signal("int", "the client's output cap (max_completion_tokens or max_tokens), "
                                           "else the fleet's default output estimate"),
        "max_output_tokens_set": Signal("bool", "true when the client capped the output"),
        "turns": Signal("int", "number of user messages"),
        "messages": Signal("int", "number of messages"),
        "has_tools": Signal("bool", "tools declared, or tool calls/results in the conversation"),
        "has_images": Signal("bool", "any image part in the conversation"),
        "images": Signal("int", "number of image parts"),
        "tenant": Signal("string", "routing.tenant, '' when absent"),
        "session_id": Signal("string", "routing.session_id, '' when absent"),
        "slo_class": Signal("string", "routing.slo_class, '' when absent"),
        "model": Signal("string", "the model the client asked for, '' when absent"),
    }),
    "difficulty": Namespace("difficulty", "The difficulty estimator's answer.", {
        "p_hard": Signal("double", "probability in [0, 1] that the cheaper model's answer is worse than the "
                                   "frontier model's; null when the estimator is unavailable", nullable=True),
        "available": Signal("bool", "false when the estimator failed, timed out or is not loaded"),
    }),
    "variables": Namespace("variables", "The policy's named constants (its 'variables' section).", None),
}

#: Functions the policy adds to CEL: name -> (signature, meaning).
FUNCTIONS: dict[str, tuple[str, str]] = {
    "cost": ("cost(target: string) -> double",
             "estimated cost of this request on the target in USD, in the target's default mode "
             "(policy/cost.py)"),
}

#: CEL standard functions and macros that common-expression-language 0.10 implements.
CEL_BUILTINS = frozenset({
    "size", "contains", "startsWith", "endsWith", "matches", "int", "uint", "double", "string", "bytes",
    "timestamp", "duration", "dyn", "type", "has", "all", "exists", "exists_one", "map", "filter",
    "getFullYear", "getMonth", "getDayOfYear", "getDayOfMonth", "getDate", "getDayOfWeek", "getHours",
    "getMinutes", "getSeconds", "getMilliseconds",
})
#: Type names that may appear as identifiers (``type(x) == int``).
CEL_TYPE_NAMES = frozenset({"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"})


def request_signals(features: RequestFeatures, request: RouteRequest, default_output_tokens: int) -> dict[str, Any]:
    """The ``request`` namespace for one request (see ``SIGNALS['request']`` for each field)."""
    routing = request.routing
    cap = features.max_output_tokens
    return {
        "prompt_tokens": features.prompt_tokens,
        "max_output_tokens": cap if cap else default_output_tokens,
        "max_output_tokens_set": bool(cap),
        "turns": features.turns,
        "messages": features.n_messages,
        "has_tools": features.has_tools,
        "has_images": features.has_images,
        "images": features.n_images,
        "tenant": routing.tenant or "",
        "session_id": routing.session_id or "",
        "slo_class": routing.slo_class or "",
        "model": request.model or "",
    }


def difficulty_signals(estimate: DifficultyEstimate) -> dict[str, Any]:
    """The ``difficulty`` namespace: ``p_hard`` (None when unavailable) and ``available``."""
    return {"p_hard": estimate.p_hard if estimate.available else None, "available": bool(estimate.available)}


def example_signals(variables: dict[str, Any] | None = None) -> dict[str, Any]:
    """A complete, typical snapshot (a short single-turn request, p_hard 0.5): the base for
    policy cases and for the compiler's type probe; override fields per case."""
    return {
        "request": {
            "prompt_tokens": 100, "max_output_tokens": 256, "max_output_tokens_set": False, "turns": 1,
            "messages": 1, "has_tools": False, "has_images": False, "images": 0, "tenant": "",
            "session_id": "", "slo_class": "", "model": "",
        },
        "difficulty": {"p_hard": 0.5, "available": True},
        "variables": dict(variables or {}),
    }


def reference_markdown() -> str:
    """The signal and function reference for policy authors, as Markdown (generated from ``SIGNALS``)."""
    lines = ["# Policy signals", "", "Names a policy's `when` expressions can read (CEL).", ""]
    for ns in SIGNALS.values():
        lines += [f"## `{ns.name}`", "", ns.doc, ""]
        if ns.fields is None:
            lines += [f"Open keys: `{ns.name}.<name>`.", ""]
            continue
        lines += ["| name | type | meaning |", "|---|---|---|"]
        for name, sig in ns.fields.items():
            t = sig.type + (" or null" if sig.nullable else "")
            lines.append(f"| `{ns.name}.{name}` | {t} | {sig.doc} |")
        lines.append("")
    lines += ["## Functions", "", "| signature | meaning |", "|---|---|"]
    lines += [f"| `{sig}` | {doc} |" for sig, doc in FUNCTIONS.values()]
    lines += ["", "CEL built-ins available: " + ", ".join(f"`{f}`" for f in sorted(CEL_BUILTINS)) + "."]
    return "\n".join(lines) + "\n"
