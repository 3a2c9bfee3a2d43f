"""The signals a policy's expressions can read, and the per-decision snapshot.

The snapshot is a plain dict built once per decision, one key per namespace::

    {"request":    {"prompt_tokens": 812, "max_output_tokens": 256, "turns": 1, ...},
     "difficulty": {"p_hard": 0.41, "available": True},
     "variables":  {"p_hard_frontier": 0.62, ...},
     "load":       {"onprem-70b": {"num_requests_waiting": 3, "age_s": 0.8, ...}},
     "budget":     {"remaining_usd": 12.5, "spent_fraction": 0.75, ...},
     "_cache":     {"onprem-70b": {"prefix_hit_ratio": 0.9, ...}},
     "_endpoint":  {"onprem-70b/decode": {"num_requests_running": 7, ...}},
     "predict":    {"onprem-70b": {"ttft_s": 0.41, "tpot_s": 0.03, "meets_slo": True, ...}}}

``SIGNALS`` declares every namespace and field with its type and meaning; the
compiler checks expressions against it (unknown names get "did you mean") and the
reference page (``pointsman policy signals``, ``docs/policy-signals.md``) is
generated from it. Three shapes of namespace:

- flat (``request``, ``difficulty``, ``budget``): ``request.prompt_tokens``;
- keyed by target (``load``, ``predict``): ``load["onprem-70b"].num_requests_waiting``; the
  key must be a fleet target (checked at compile time when it is a string literal);
- relative to the rule's own route (``cache``, ``endpoint``): ``cache.prefix_hit_ratio``
  in a rule routing to ``onprem-70b`` reads that target's value. The compiler rewrites
  these to the internal keyed roots ``_cache["<target>"]`` and
  ``_endpoint["<target>/<role>"]`` (``relative_key``), so one CEL context per decision
  serves every rule.

The builders here turn state readings (``EndpointLoad``, ``BudgetSnapshot``) into
those dicts; ``policy/live.py`` calls them per decision, for what the policy reads only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from pydantic import Field
from typing_extensions import TypedDict

from pointsman.json_types import JSONValue
from pointsman.request import FilePart, has_1h_mark

if TYPE_CHECKING:  # pragma: no cover
    from pointsman.estimator.estimate import DifficultyEstimate
    from pointsman.estimator.features import RequestFeatures
    from pointsman.policy.budget.ledger import BudgetSnapshot, BudgetStatus
    from pointsman.policy.signals.load_board import EndpointLoad
    from pointsman.request import RequestView


#: A share, fraction or probability: a float in [0, 1] (``policy test`` holds a case's value to it).
Fraction = Annotated[float, Field(ge=0, le=1)]


class RequestSignals(TypedDict):
    """The ``request`` namespace (``SIGNALS["request"]`` gives each field's meaning)."""

    prompt_tokens: int
    prompt_tokens_exact: bool
    prompt_tokens_upper: int
    longest_prompt_tokens_upper: int
    max_output_tokens: int
    max_output_tokens_set: bool
    turns: int
    messages: int
    has_tools: bool
    has_images: bool
    images: int
    images_low_detail: int
    has_audio: bool
    has_files: bool
    has_cache_control: bool
    has_cache_control_1h: bool
    stored_state: str
    tenant: str
    team: str
    session_id: str
    slo_class: str
    model: str


class DifficultySignals(TypedDict):
    """The ``difficulty`` namespace: ``p_hard`` (None when unavailable) and ``available``."""

    p_hard: Fraction | None
    available: bool


class LoadValues(TypedDict):
    """The load fields shared by ``load[target]`` and ``endpoint`` (``_load_fields``)."""

    num_requests_running: int | None
    num_requests_waiting: int | None
    kv_cache_usage: Fraction | None
    ttft_p50_ms: float | None
    tpot_p50_ms: float | None
    prefill_utilization: Fraction | None
    decode_utilization: Fraction | None
    inflight_requests: int
    outstanding_requests: int
    age_s: float
    stale: bool
    saturated: bool


class LoadSignals(LoadValues):
    """``load[target]``: the load fields plus the target's endpoint counts and prefill pool state."""

    endpoints: int
    healthy_endpoints: int
    prefill_queue_s: float | None
    prefill_saturated: bool


class EndpointSignals(LoadValues):
    """``endpoint``: the load fields of one endpoint plus its identity, health, hit and cost."""

    name: str
    url: str
    healthy: bool
    prefix_hit_ratio: Fraction
    cost_s: float
    predicted_ttft_s: float
    predicted_tpot_s: float


class PredictSignals(TypedDict):
    """``predict[target]``: predicted latency of the request there (``SIGNALS["predict"]``)."""

    ttft_s: float
    tpot_s: float
    batch_tpot_s: float
    slo_score: float
    meets_slo: bool
    mode: str
    queue_s: float
    prefill_s: float
    transfer_s: float
    aggregated_ttft_s: float | None
    aggregated_tpot_s: float | None
    aggregated_batch_tpot_s: float | None
    disaggregated_ttft_s: float | None
    disaggregated_tpot_s: float | None
    slo_ttft_s: float
    slo_tpot_s: float


class CacheSignals(TypedDict):
    """The ``cache`` namespace for one target."""

    prefix_hit_ratio: Fraction
    prefix_hit_tokens: int
    shared_hit_ratio: Fraction
    endpoint: str
    session_endpoint: str
    session_target: str


class BudgetSignals(TypedDict):
    """The ``budget`` namespace (``math.inf`` limits when unlimited)."""

    limited: bool
    remaining_usd: float
    spent_usd: float
    limit_usd: float
    spent_fraction: float
    window: str
    window_elapsed_fraction: Fraction
    pace_gap: float
    scope: str


class Snapshot(TypedDict):
    """A whole signal snapshot, as ``example_signals`` lays it out (policy cases, the type probe)."""

    request: RequestSignals
    difficulty: DifficultySignals
    variables: Mapping[str, JSONValue]
    load: dict[str, LoadSignals]
    budget: BudgetSignals
    _cache: dict[str, CacheSignals]
    _endpoint: dict[str, EndpointSignals]
    predict: dict[str, PredictSignals]


@dataclass(frozen=True)
class Signal:
    """One field of a namespace: CEL ``type`` (int, double, bool, string, null_type) and its meaning;
    ``fraction``: its value is in [0, 1] (``policy check`` names a comparison no such value can decide)."""

    type: str
    doc: str
    nullable: bool = False
    fraction: bool = False


@dataclass(frozen=True)
class Namespace:
    """A root name visible to expressions; ``fields`` None means open keys (checked elsewhere).

    ``shape``: ``flat`` (``ns.field``), ``by_target`` (``ns["<target>"].field``) or
    ``relative`` (``ns.field``, the rule's route target; see the module docstring).
    ``aged``: its values come from measurements with an age (the trace reports ``age_s``)."""

    name: str
    doc: str
    fields: dict[str, Signal] | None
    shape: str = "flat"
    aged: bool = False


def _load_fields() -> dict[str, Signal]:
    return {
        "num_requests_running": Signal("int", "requests in the running batch (engine-reported; summed over the "
                                              "endpoints that report it); null when unknown or stale", nullable=True),
        "num_requests_waiting": Signal("int", "requests in the waiting queue, plus Pointsman's dispatches the "
                                              "engine has not reported yet (a target's: summed over its endpoints, "
                                              "one without telemetry adding its requests in flight); null when "
                                              "unknown or stale", nullable=True),
        "kv_cache_usage": Signal("double", "fraction 0-1 of KV-cache blocks in use (mean over endpoints); "
                                           "null when unknown", nullable=True, fraction=True),
        "ttft_p50_ms": Signal("double", "median time to first token, ms (engine-reported); null when unknown",
                              nullable=True),
        "tpot_p50_ms": Signal("double", "median time per output token, ms (engine-reported); null when unknown",
                              nullable=True),
        "prefill_utilization": Signal("double", "fraction 0-1 of GPU time busy with prefill, when telemetry "
                                                "reports it; else null", nullable=True, fraction=True),
        "decode_utilization": Signal("double", "fraction 0-1 of GPU time busy with decode, when telemetry "
                                               "reports it; else null", nullable=True, fraction=True),
        "inflight_requests": Signal("int", "requests Pointsman dispatched there whose outcome has not arrived"),
        "outstanding_requests": Signal("int", "running + waiting when the engine reports both, else "
                                              "inflight_requests (never null; a target's: summed over its "
                                              "endpoints, each counted so)"),
        "age_s": Signal("double", "seconds since the engine values were measured (the oldest endpoint's; "
                                  "0 for in-flight accounting alone; a stale reading keeps its age)"),
        "stale": Signal("bool", "a reading is older than the policy's signals.load.max_age_s"),
        "saturated": Signal("bool", "a stale reading is read as full (signals.load.on_stale: saturated)"),
    }


_LOAD_DOC = ("Load of one target: its endpoints' readings merged (pushed snapshots, scraped /metrics and "
             "Pointsman's in-flight accounting; see policy/signals/load_board.py). Read as `load[\"<target>\"].<field>`. "
             "A reading older than `signals.load.max_age_s` (default 10 s) is stale, and the policy's "
             "`signals.load.on_stale` says what it means: `unknown` (default: engine fields become null, so a "
             "rule comparing them errors and is skipped, named in the decision), `saturated` (read as full: "
             "kv_cache_usage 1.0, a huge waiting queue) or `ignore` (used as is).")

_PREDICT_DOC = ("Predicted latency of this request on a target (policy/selection/latency.py), at the endpoint the "
                "picker would choose there, from the live load, cache and telemetry signals; read as "
                "`predict[\"<target>\"].<field>`. The inputs are in the decision's trace (`prediction`).")

SIGNALS: dict[str, Namespace] = {
    "request": Namespace("request", "Facts about the request, computed before routing.", {
        "prompt_tokens": Signal("int", "prompt length in the targets' tokens, what prices it (exact when the gateway "
                                       "sends routing.prompt_tokens and it is plausible; tools and images counted; "
                                       "else estimated on the safe side: estimator/billed_tokens.py)"),
        "prompt_tokens_exact": Signal("bool", "true when prompt_tokens is the gateway's routing.prompt_tokens; cost() and "
                                              "the context-window filter then add the images', audio's and files' tokens "
                                              "by the target's rules to it, else replace the 765 tokens an image counts "
                                              "in prompt_tokens (1,600 in prompt_tokens_upper) by them"),
        "prompt_tokens_upper": Signal("int", "a safe-side upper bound of prompt_tokens for the targets' own "
                                             "tokenizers (whitespace, out-of-vocabulary characters by their bytes, "
                                             "a byte scan of the whole text; estimator/token_bounds.py); what the "
                                             "context-window filter compares; = prompt_tokens when the gateway sends it"),
        "longest_prompt_tokens_upper": Signal("int", "for a batch (a Completions prompt list; routing.batch), a "
                                                     "safe-side upper bound of its longest prompt's tokens: each prompt "
                                                     "is its own sequence, so the context-window filter compares this "
                                                     "instead of prompt_tokens_upper; 0 for a request of one sequence"),
        "max_output_tokens": Signal("int", "the client's output cap (max_completion_tokens or max_tokens), "
                                           "else the fleet's default output estimate"),
        "max_output_tokens_set": Signal("bool", "true when the client capped the output"),
        "turns": Signal("int", "number of user messages"),
        "messages": Signal("int", "number of messages"),
        "has_tools": Signal("bool", "tools declared, or tool calls/results in the conversation"),
        "has_images": Signal("bool", "any image part in the conversation"),
        "images": Signal("int", "number of image parts (cost() and the context-window filter count each by its "
                                "target's rule at its detail and the size read from an inline image's header, "
                                "else the most the rule bills (the context-window filter: the least), policy/media_tokens.py)"),
        "images_low_detail": Signal("int", "image parts asking detail 'low' (of images)"),
        "has_audio": Signal("bool", "any input_audio part in the conversation (not counted in prompt_tokens; cost() and "
                                     "the context-window filter count its seconds by the target's rule), "
                                     "or an audio answer asked (modalities, audio) or referenced (an assistant "
                                     "message's audio id, billed again: counted as audio of unknown size)"),
        "has_files": Signal("bool", "any file part (a PDF, ...) in the conversation (not counted in prompt_tokens; cost() "
                                     "and the context-window filter count its pages by the target's rule)"),
        "has_cache_control": Signal("bool", "a message, content part or tool marks a prompt-cache breakpoint "
                                            "(cache_control): what an explicit-cache frontier target caches"),
        "has_cache_control_1h": Signal("bool", "a cache_control breakpoint asks the 1-hour lifetime (ttl '1h'), "
                                               "whose cache write is priced higher"),
        "stored_state": Signal("string", "the field by which an OpenAI Responses request continues state its "
                                         "provider stored ('previous_response_id', 'conversation', 'prompt' for a stored "
                                         "prompt template, or 'item_reference' for an input item naming a stored "
                                         "one; '' when none): "
                                         "only a target holding it is eligible (capabilities filter; the fleet's "
                                         "stored_state), and the stored turns, billed as input, are not counted in "
                                         "prompt_tokens, prompt_tokens_upper or cost(): lower bounds"),
        "tenant": Signal("string", "routing.tenant, '' when absent"),
        "team": Signal("string", "routing.team, '' when absent"),
        "session_id": Signal("string", "routing.session_id, '' when absent"),
        "slo_class": Signal("string", "routing.slo_class, '' when absent"),
        "model": Signal("string", "the model the client asked for, '' when absent"),
    }),
    "difficulty": Namespace("difficulty", "The difficulty estimator's answer.", {
        "p_hard": Signal("double", "probability in [0, 1] that the cheaper model's answer is worse than the "
                                   "frontier model's; null when the estimator is unavailable", nullable=True, fraction=True),
        "available": Signal("bool", "false when the estimator failed, timed out or is not loaded"),
    }),
    "variables": Namespace("variables", "The policy's named constants (its 'variables' section).", None),
    "load": Namespace("load", _LOAD_DOC, {
        **_load_fields(),
        "endpoints": Signal("int", "endpoints of the target (all its pools; 1 for a frontier API)"),
        "healthy_endpoints": Signal("int", "endpoints not marked unhealthy"),
        "prefill_queue_s": Signal("double", "predicted seconds of prefill work queued on the least-loaded "
                                            "prefill endpoint ahead of this request: a waiting request the engine "
                                            "reports beyond Pointsman's own counts the mean prompt of Pointsman's "
                                            "requests in flight there, else this request's prompt, so with no "
                                            "dispatch of its own there it grows with this prompt; null without a "
                                            "prefill pool", nullable=True),
        "prefill_saturated": Signal("bool", "the prefill pool cannot take more for this request: every healthy "
                                            "prefill endpoint is saturated or queues at least "
                                            "disaggregation.max_prefill_queue_s (as prefill_queue_s); false without "
                                            "a prefill pool"),
    }, shape="by_target", aged=True),
    "endpoint": Namespace("endpoint", "The endpoint the picker would choose first for the rule's own route: "
                                      "in the aggregated pool for an aggregated route, the decode endpoint for a "
                                      "disaggregated one, for `auto` the one of the mode the route runs in (the "
                                      "decode endpoint when the P/D guards, the rules of thumb and, with "
                                      "disaggregation.by_prediction, the prediction disaggregate it, else the "
                                      "aggregated pool's), a frontier target's API. Same load fields as `load`, "
                                      "for one endpoint.", {
        **_load_fields(),
        "name": Signal("string", "the endpoint's name in the fleet file ('' when unnamed)"),
        "url": Signal("string", "the endpoint's URL"),
        "healthy": Signal("bool", "false when marked unhealthy (then every endpoint of the pool is)"),
        "prefix_hit_ratio": Signal("double", "share 0-1 of this prompt's prefix cached on this endpoint", fraction=True),
        "cost_s": Signal("double", "the picker's predicted seconds for this request there "
                                   "(queued + uncached prefill + decode; policy/selection/pickers.py)"),
        "predicted_ttft_s": Signal("double", "predicted time to first token of this request through this endpoint, "
                                             "seconds (its route's mode; policy/selection/latency.py; infinite when "
                                             "unhealthy)"),
        "predicted_tpot_s": Signal("double", "predicted mean time per output token there, seconds (as above)"),
    }, shape="relative", aged=True),
    "predict": Namespace("predict", _PREDICT_DOC, {
        "ttft_s": Signal("double", "predicted time to first token, seconds: prefill queued ahead + this request's "
                                   "uncached prefill (or shared-tier restore), at least one forward pass (the "
                                   "prefilling pool's decode_step_s) + P/D KV transfer; a frontier tier's "
                                   "reported or declared median; infinite without a healthy endpoint"),
        "tpot_s": Signal("double", "predicted mean time per output token, seconds: the decode batch's share and step "
                                   "floor, prefill interference (aggregated, 90th percentile), doubled when free KV "
                                   "runs short"),
        "batch_tpot_s": Signal("double", "predicted TPOT of the requests already decoding on the chosen aggregated "
                                         "endpoint once the prefill queued there and this request's run in their "
                                         "steps, seconds (step + min((queue_s + prefill work) / 6, chunk_s - step): a "
                                         "short answer's 6 steps, none longer than one chunk of the pool's "
                                         "max_num_batched_tokens, chunk_s); "
                                         "0 disaggregated, on a frontier tier or with nothing running there"),
        "slo_score": Signal("double", "max(ttft_s / slo_ttft_s, max(tpot_s, batch_tpot_s) / slo_tpot_s): at most 1 "
                                      "meets the SLO, lower is better (what the P/D choice compares); infinite "
                                      "without a healthy endpoint"),
        "meets_slo": Signal("bool", "ttft_s, tpot_s and batch_tpot_s within the request's SLO class "
                                    "(routing.slo_class, else the fleet's default)"),
        "mode": Signal("string", "the mode predicted: the better of aggregated and disaggregated by the SLO, "
                                 "disaggregated only where the disaggregation guards allow it"),
        "queue_s": Signal("double", "the part of ttft_s queued ahead (prefill work on the chosen endpoint, "
                                    "counted as prefill_queue_s is)"),
        "prefill_s": Signal("double", "the part of ttft_s for this request's own prefill: its "
                                      "uncached tokens' work, at least one forward pass (decode_step_s)"),
        "transfer_s": Signal("double", "the part of ttft_s for the P/D KV transfer of the prompt tokens the chosen decode "
                                     "endpoint does not hold, seconds (0 aggregated)"),
        "aggregated_ttft_s": Signal("double", "ttft_s aggregated; null without that mode", nullable=True),
        "aggregated_tpot_s": Signal("double", "tpot_s aggregated; null without that mode", nullable=True),
        "aggregated_batch_tpot_s": Signal("double", "batch_tpot_s aggregated; null without that mode", nullable=True),
        "disaggregated_ttft_s": Signal("double", "ttft_s disaggregated; null without that mode", nullable=True),
        "disaggregated_tpot_s": Signal("double", "tpot_s disaggregated; null without that mode", nullable=True),
        "slo_ttft_s": Signal("double", "the request's SLO class's TTFT objective, seconds"),
        "slo_tpot_s": Signal("double", "the request's SLO class's TPOT objective, seconds"),
    }, shape="by_target"),
    "cache": Namespace("cache", "KV-cache locality for the rule's own route target (prefix index per endpoint, "
                                "updated at dispatch; policy/signals/prefix_index.py).", {
        "prefix_hit_ratio": Signal("double", "largest share 0-1 of this prompt's prefix cached on one endpoint of "
                                             "the target that can serve it locally (aggregated or decode pool; a "
                                             "frontier target's provider prompt cache)", fraction=True),
        "prefix_hit_tokens": Signal("int", "the tokens of that cached prefix"),
        "shared_hit_ratio": Signal("double", "share 0-1 of the prompt, after the local hit, that the target's "
                                             "shared KV tier holds (restorable instead of recomputed); 0 without one",
                                   fraction=True),
        "endpoint": Signal("string", "name (else URL) of the endpoint holding that prefix; '' when none"),
        "session_endpoint": Signal("string", "name (else URL) of the endpoint of this session's previous request "
                                             "in the target; '' when none"),
        "session_target": Signal("string", "target of this session's previous request (any target); '' when none"),
    }, shape="relative"),
    "budget": Namespace("budget", "The request's budgets (scopes tenant:<request.tenant>, team:<request.team> "
                                  "and the caller's API key) in the budget ledger, summarised by the binding "
                                  "budget: the one with the least USD remaining; spent_fraction and pace_gap are "
                                  "each the largest over all of them. Without any budget the request "
                                  "is unlimited: `limited` false, `remaining_usd` and `limit_usd` are infinite "
                                  "(null in JSON traces), fractions 0.", {
        "limited": Signal("bool", "some budget applies to the request"),
        "remaining_usd": Signal("double", "USD left in the binding budget (infinite when unlimited)"),
        "spent_usd": Signal("double", "USD settled plus reserved in the binding budget's window"),
        "limit_usd": Signal("double", "the binding budget's limit in USD (infinite when unlimited)"),
        "spent_fraction": Signal("double", "the largest spent / limit over the request's budgets (1 for a zero "
                                           "budget; 0 when unlimited): the binding budget's spent_usd / limit_usd, "
                                           "or another budget's nearer its limit"),
        "window": Signal("string", "the binding budget's window: day or month ('' when unlimited)"),
        "window_elapsed_fraction": Signal("double", "fraction 0-1 of the binding budget's UTC window elapsed "
                                                    "(of the current UTC day when unlimited)", fraction=True),
        "pace_gap": Signal("double", "the largest spent fraction - elapsed fraction of its window over the "
                                     "request's budgets: > 0 when spending on any of them runs ahead of time (a "
                                     "month budget ahead of pace beside a day budget with less USD left; 0 when "
                                     "unlimited)"),
        "scope": Signal("string", "the binding budget's scope, e.g. tenant:acme ('' when unlimited)"),
    }),
}

class DraftSignals(TypedDict):
    """The ``draft`` namespace, read by a policy's ``verify`` rules only (``SIGNALS['draft']``)."""

    p_bad: Fraction
    tokens: int
    length_ratio: float
    finish_reason: str
    truncated: bool
    partial: bool
    empty: bool
    refusal: bool
    hedging: bool
    repetition: Fraction
    has_logprobs: bool
    logprob_mean: float | None
    logprob_min: float | None
    low_logprob_share: Fraction | None
    verifier: str
    target: str
    on_prem: bool


#: The ``draft`` namespace: only ``verify`` rules see it (``VERIFY_SIGNALS``).
DRAFT_NAMESPACE = Namespace("draft", "The draft a gateway sends to `POST /v1/verify`: what the on-prem model answered "
                                     "(or its first tokens) and the verifier's score. Readable in the policy's "
                                     "`verify` rules only (estimator/draft.py, estimator/verifier.py).", {
    "p_bad": Signal("double", "the verifier's probability 0-1 that the draft loses to the frontier's answer (the "
                              "shipped verifier is a documented heuristic: read it as a ranking)", fraction=True),
    "tokens": Signal("int", "draft length in tokens (the engine's completion_tokens, else counted)"),
    "length_ratio": Signal("double", "draft tokens / prompt tokens"),
    "finish_reason": Signal("string", "stop, length, content_filter, tool_calls, other; '' when unknown or streaming"),
    "truncated": Signal("bool", "finish_reason is length: cut at the output cap"),
    "partial": Signal("bool", "only the first tokens were sent (streaming)"),
    "empty": Signal("bool", "no answer text and no tokens"),
    "refusal": Signal("bool", "the draft opens with a refusal (I'm sorry, I cannot, as an AI ...)"),
    "hedging": Signal("bool", "the draft opens by hedging (I'm not sure, it depends, I don't know ...)"),
    "repetition": Signal("double", "share 0-1 of word trigrams that repeat an earlier one (a loop near 1)", fraction=True),
    "has_logprobs": Signal("bool", "the engine's token log-probabilities were sent"),
    "logprob_mean": Signal("double", "mean token log-probability (<= 0); null without them", nullable=True),
    "logprob_min": Signal("double", "lowest token log-probability; null without them", nullable=True),
    "low_logprob_share": Signal("double", "share 0-1 of tokens with probability below 0.2; null without them",
                                nullable=True, fraction=True),
    "verifier": Signal("string", "the verifier's version (heuristic-v2 for the shipped one)"),
    "target": Signal("string", "the target that wrote the draft (the decision's)"),
    "on_prem": Signal("bool", "the draft came from an on-prem target (not a frontier API)"),
})
#: What ``verify`` rules read: every route signal plus ``draft``.
VERIFY_SIGNALS: dict[str, Namespace] = {**SIGNALS, "draft": DRAFT_NAMESPACE}


def example_draft() -> DraftSignals:
    """A typical, acceptable draft (policy cases start from it; the compiler's type probe too)."""
    return {"p_bad": 0.3, "tokens": 150, "length_ratio": 1.5, "finish_reason": "stop", "truncated": False,
            "partial": False, "empty": False, "refusal": False, "hedging": False, "repetition": 0.0,
            "has_logprobs": True, "logprob_mean": -0.4, "logprob_min": -3.0, "low_logprob_share": 0.1,
            "verifier": "heuristic-v2", "target": "onprem-8b", "on_prem": True}


#: Internal CEL roots of the relative namespaces (see the module docstring).
RELATIVE_ROOTS: dict[str, str] = {"cache": "_cache", "endpoint": "_endpoint"}


#: Functions the policy adds to CEL: name -> (signature, meaning).
FUNCTIONS: dict[str, tuple[str, str]] = {
    "cost": ("cost(target: string) -> double",
             "estimated cost of this request on the target in USD, in the target's default mode, with the "
             "expected cached prefix and the pool's current utilization (policy/cost.py); an unknown target "
             "is a compile error (string literal) or a run-time error that skips the rule"),
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


def request_signals(features: RequestFeatures, view: RequestView, default_output_tokens: int) -> RequestSignals:
    """The ``request`` namespace for one request (see ``SIGNALS['request']`` for each field)."""
    routing, request = view.routing, view.request
    cap = features.max_output_tokens
    marks = request.cache_marks()  # once: ``has_cache_control`` and ``has_cache_control_1h`` both read them
    return {
        "prompt_tokens": features.priced_prompt_tokens,
        "prompt_tokens_exact": features.prompt_tokens_exact,
        "prompt_tokens_upper": max(features.prompt_tokens, features.prompt_tokens_upper),
        "longest_prompt_tokens_upper": features.longest_prompt_tokens_upper,
        "max_output_tokens": cap if cap else default_output_tokens,
        "max_output_tokens_set": bool(cap),
        "turns": features.turns,
        "messages": features.n_messages,
        "has_tools": features.has_tools,
        "has_images": features.has_images,
        "images": features.n_images,
        "images_low_detail": features.n_low_detail_images,
        "has_audio": request.has_audio(),
        "has_files": request.has_part(FilePart),
        "has_cache_control": bool(marks),
        "has_cache_control_1h": has_1h_mark(marks),
        "stored_state": request.stored_state or "",
        "tenant": routing.tenant or "",
        "team": routing.team or "",
        "session_id": routing.session_id or "",
        "slo_class": routing.slo_class or "",
        "model": request.model or "",
    }


def difficulty_signals(estimate: DifficultyEstimate) -> DifficultySignals:
    """The ``difficulty`` namespace: ``p_hard`` (None when unavailable) and ``available``."""
    return {"p_hard": estimate.p_hard if estimate.available else None, "available": bool(estimate.available)}


def relative_key(namespace: str, target: str, role: str) -> str:
    """The key of a relative namespace's value for a rule routing to ``target`` whose
    endpoint would be in pool ``role``: ``cache`` by target, ``endpoint`` by ``target/role``."""
    return target if namespace == "cache" else f"{target}/{role}"


def load_signals(reading: EndpointLoad | None, now: float | None, *, endpoints: int, healthy_endpoints: int,
                 prefill_queue_s: float | None = None, prefill_saturated: bool = False) -> LoadSignals:
    """The ``load[target]`` value from a pool-level ``EndpointLoad`` (``load_board.aggregate_loads``;
    None when nothing is known: engine fields null, counts 0, age 0)."""
    return {**_load_values(reading, now), "endpoints": endpoints, "healthy_endpoints": healthy_endpoints,
            "prefill_queue_s": prefill_queue_s, "prefill_saturated": prefill_saturated}


def _load_values(reading: EndpointLoad | None, now: float | None) -> LoadValues:
    if reading is None:
        return {"num_requests_running": None, "num_requests_waiting": None, "kv_cache_usage": None,
                "ttft_p50_ms": None, "tpot_p50_ms": None, "prefill_utilization": None, "decode_utilization": None,
                "inflight_requests": 0, "outstanding_requests": 0, "age_s": 0.0, "stale": False, "saturated": False}
    return {
        "num_requests_running": reading.num_requests_running,
        "num_requests_waiting": reading.num_requests_waiting,
        "kv_cache_usage": reading.kv_cache_usage,
        "ttft_p50_ms": reading.ttft_p50_ms,
        "tpot_p50_ms": reading.tpot_p50_ms,
        "prefill_utilization": reading.prefill_utilization,
        "decode_utilization": reading.decode_utilization,
        "inflight_requests": reading.inflight_requests,
        "outstanding_requests": reading.outstanding_requests,
        "age_s": reading.age_s(now),
        "stale": reading.stale,
        "saturated": reading.saturated,
    }


def endpoint_signals(reading: EndpointLoad | None, now: float | None, *, name: str, url: str, healthy: bool,
                     prefix_hit_ratio: float, cost_s: float, predicted_ttft_s: float = math.inf,
                     predicted_tpot_s: float = math.inf) -> EndpointSignals:
    """The ``endpoint`` value for one endpoint (``reading``: its ``EndpointLoad`` or None)."""
    return {**_load_values(reading, now), "name": name, "url": url, "healthy": healthy,
            "prefix_hit_ratio": prefix_hit_ratio, "cost_s": cost_s, "predicted_ttft_s": predicted_ttft_s,
            "predicted_tpot_s": predicted_tpot_s}


def example_predict(ttft_s: float = 0.2, tpot_s: float = 0.03, slo_ttft_s: float = 2.0,
                    slo_tpot_s: float = 0.1) -> PredictSignals:
    """A ``predict[target]`` value of an idle target (aggregated, well within the default SLO)."""
    return {"ttft_s": ttft_s, "tpot_s": tpot_s, "batch_tpot_s": 0.0,
            "slo_score": max(ttft_s / slo_ttft_s, tpot_s / slo_tpot_s),
            "meets_slo": ttft_s <= slo_ttft_s and tpot_s <= slo_tpot_s,
            "mode": "aggregated", "queue_s": 0.0, "prefill_s": ttft_s, "transfer_s": 0.0,
            "aggregated_ttft_s": ttft_s, "aggregated_tpot_s": tpot_s, "aggregated_batch_tpot_s": 0.0,
            "disaggregated_ttft_s": None,
            "disaggregated_tpot_s": None, "slo_ttft_s": slo_ttft_s, "slo_tpot_s": slo_tpot_s}


def cache_signals(prefix_hit_ratio: float = 0.0, prefix_hit_tokens: int = 0, shared_hit_ratio: float = 0.0,
                  endpoint: str = "", session_endpoint: str = "", session_target: str = "") -> CacheSignals:
    """The ``cache`` value for one target (see ``SIGNALS['cache']``)."""
    return {"prefix_hit_ratio": prefix_hit_ratio, "prefix_hit_tokens": prefix_hit_tokens,
            "shared_hit_ratio": shared_hit_ratio, "endpoint": endpoint, "session_endpoint": session_endpoint,
            "session_target": session_target}


def budget_signals(snapshot: BudgetSnapshot | None, now: float) -> BudgetSignals:
    """The ``budget`` namespace from a ``BudgetSnapshot`` (None: unlimited) at Unix time ``now``.
    Unlimited: ``remaining_usd``/``limit_usd`` are ``math.inf`` (null in JSON traces)."""
    from pointsman.policy.budget.units import window_of

    binding = None if snapshot is None else snapshot.binding
    if binding is None:
        day = window_of("day", now)
        return {"limited": False, "remaining_usd": math.inf, "spent_usd": 0.0, "limit_usd": math.inf,
                "spent_fraction": 0.0, "window": "", "pace_gap": 0.0, "scope": "",
                "window_elapsed_fraction": (now - day.start_s) / (day.end_s - day.start_s)}

    def spent_and_elapsed(status: BudgetStatus) -> tuple[float, float]:
        w = window_of(status.window, now)
        limit = status.limit_usd if status.limit_usd is not None else math.inf
        return (status.spent_usd / limit if limit > 0 else 1.0,
                min(1.0, max(0.0, (now - w.start_s) / (w.end_s - w.start_s))))

    # the fractions are each the largest over every limited budget (the safe side): the binding budget (least USD
    # left) can be a day budget on pace while the month budget beside it runs far ahead of its window
    assert snapshot is not None  # (it has a binding status)
    fractions = [spent_and_elapsed(s) for s in snapshot.statuses if s.limit_usd is not None]
    elapsed = spent_and_elapsed(binding)[1]
    limit = binding.limit_usd if binding.limit_usd is not None else math.inf  # the binding status is limited
    return {"limited": True, "remaining_usd": binding.remaining_usd, "spent_usd": binding.spent_usd,
            "limit_usd": limit, "spent_fraction": max(f for f, _ in fractions), "window": binding.window,
            "window_elapsed_fraction": elapsed, "pace_gap": max(f - e for f, e in fractions), "scope": binding.scope}


def example_signals(variables: Mapping[str, JSONValue] | None = None, targets: Iterable[str] = ()) -> Snapshot:
    """A complete, typical snapshot (a short single-turn request, p_hard 0.5, an idle fleet with
    fresh telemetry, a cold cache, no budget): the base for policy cases and for the
    compiler's type probe; override fields per case. ``targets``: fleet target names for
    the keyed and relative namespaces (``load``, ``_cache``; ``_endpoint`` is keyed by
    ``target/role`` and filled by the caller, see ``example_endpoint``)."""
    targets = list(targets)
    return {
        "request": {
            "prompt_tokens": 100, "prompt_tokens_exact": False, "prompt_tokens_upper": 100, "longest_prompt_tokens_upper": 0,
            "max_output_tokens": 256, "max_output_tokens_set": False, "turns": 1,
            "messages": 1, "has_tools": False, "has_images": False, "images": 0, "images_low_detail": 0,
            "has_audio": False, "has_files": False,
            "has_cache_control": False, "has_cache_control_1h": False, "stored_state": "",
            "tenant": "", "team": "",
            "session_id": "", "slo_class": "", "model": "",
        },
        "difficulty": {"p_hard": 0.5, "available": True},
        "variables": dict(variables or {}),
        "load": {t: example_load() for t in targets},
        "budget": {"limited": False, "remaining_usd": math.inf, "spent_usd": 0.0, "limit_usd": math.inf,
                   "spent_fraction": 0.0, "window": "", "window_elapsed_fraction": 0.5, "pace_gap": 0.0, "scope": ""},
        "_cache": {t: cache_signals() for t in targets},
        "_endpoint": {},
        "predict": {t: example_predict() for t in targets},
    }


def example_load() -> LoadSignals:
    """A fresh, idle ``load[target]`` value: every field known except the utilizations (null:
    telemetry rarely reports them, and costs then use the fleet's ``assumed_utilization``)."""
    return {"num_requests_running": 0, "num_requests_waiting": 0, "kv_cache_usage": 0.0, "ttft_p50_ms": 0.0,
            "tpot_p50_ms": 0.0, "prefill_utilization": None, "decode_utilization": None, "inflight_requests": 0,
            "outstanding_requests": 0, "age_s": 0.0, "stale": False, "saturated": False, "endpoints": 1,
            "healthy_endpoints": 1, "prefill_queue_s": 0.0, "prefill_saturated": False}


def example_endpoint(name: str = "", url: str = "") -> EndpointSignals:
    """A fresh, idle ``endpoint`` value (as ``example_load``, for one endpoint)."""
    load = example_load()
    return {"num_requests_running": load["num_requests_running"], "num_requests_waiting": load["num_requests_waiting"],
            "kv_cache_usage": load["kv_cache_usage"], "ttft_p50_ms": load["ttft_p50_ms"],
            "tpot_p50_ms": load["tpot_p50_ms"], "prefill_utilization": load["prefill_utilization"],
            "decode_utilization": load["decode_utilization"], "inflight_requests": load["inflight_requests"],
            "outstanding_requests": load["outstanding_requests"], "age_s": load["age_s"], "stale": load["stale"],
            "saturated": load["saturated"], "name": name, "url": url, "healthy": True, "prefix_hit_ratio": 0.0,
            "cost_s": 0.0, "predicted_ttft_s": 0.2, "predicted_tpot_s": 0.03}


def reference_markdown() -> str:
    """The signal and function reference for policy authors, as Markdown (generated from
    ``SIGNALS`` and ``FUNCTIONS``; ``docs/policy-signals.md`` is this page)."""
    lines = ["# Policy signals", "",
             "Names a policy's `when` expressions can read (CEL). Generated from `pointsman.policy.signals.namespaces` by "
             "`pointsman policy signals --output docs/policy-signals.md`; do not edit by hand.", "",
             "Every signal a decision's evaluated rules read appears in its trace (`routing.explain`) with its "
             "value and age (`age_s`; 0 for values computed at decision time), and so does every function call "
             "they made, as written (`cost(\"frontier-large\")`). Infinite values (an unlimited "
             "budget) appear there as null.", ""]
    for ns in VERIFY_SIGNALS.values():
        lines += [f"## `{ns.name}`", "", ns.doc, ""]
        if ns.fields is None:
            lines += [f"Open keys: `{ns.name}.<name>`.", ""]
            continue
        if ns.shape == "by_target":
            lines += [f"Read as `{ns.name}[\"<target>\"].<field>`; the target must be in the fleet.", ""]
        elif ns.shape == "relative":
            lines += [f"Relative to the rule: `{ns.name}.<field>` reads the value for the target of the rule's "
                      "own `route` (not its fallbacks).", ""]
        lines += ["| name | type | meaning |", "|---|---|---|"]
        prefix = f'{ns.name}["<target>"]' if ns.shape == "by_target" else ns.name
        for name, sig in ns.fields.items():
            t = sig.type + (" or null" if sig.nullable else "")
            lines.append(f"| `{prefix}.{name}` | {t} | {sig.doc} |")
        lines.append("")
    lines += ["## Functions", "", "| signature | meaning |", "|---|---|"]
    lines += [f"| `{sig}` | {doc} |" for sig, doc in FUNCTIONS.values()]
    lines += ["", "CEL built-ins available: " + ", ".join(f"`{f}`" for f in sorted(CEL_BUILTINS)) + "."]
    return "\n".join(lines) + "\n"
