"""The outcome payload: what a gateway reports after a routed request ran
(``POST /v1/outcomes``, one object or a list), validated with pydantic.

Serving-safe: imports only pydantic, the error tree and ``json_types``.

Batch bodies (one JSON object or a list of at most ``MAX_BATCH``) are read with ``batch_items``,
``json_object`` and ``field_problem``, which the service's telemetry and policy bodies share.

One outcome, as JSON (every field but ``decision_id`` is optional)::

    {"decision_id": "0190f3c2a1b2...",          # from the decision (x-pointsman-decision-id)
     "outcome_id": "0190f3c2a1b2...-shadow-1",   # default: the decision id (one outcome per decision; a
                                                #   shadow's: <decision id>/shadow:<served_target>)
     "served_target": "onprem-8b",              # the fleet target that answered (fallback, experiment);
     "served_model": "llama-3.1-8b",            #   default: the decision's target; upstream model name
     "served_endpoint": "llama-8b-1",           # the endpoint that answered (a retry may go to another of the
                                                #   target's): its fleet id (URL), name, host:port or base URL
     "upstream_status": 503,                    # the upstream's HTTP status (100-599; 400 and above with
                                                #   status ok is refused as contradictory)
     "shadow": false,                           # true: answered for evaluation only, never shown to the user
                                                #   (then served_target is required: the model that answered)
     "status": "ok",                            # ok | error | timeout | cancelled
     "error": null,                             # error text when status != ok (at most 1000 chars)
     "usage": {"prompt_tokens": 812, "cached_tokens": 512, "completion_tokens": 140},
     "ttft_ms": 180.0, "tpot_ms": 22.5, "e2e_latency_ms": 3320.0,
     "time_s": 1735689600.5,                    # when the answer completed (Unix seconds), optional
     "quality": {"judge_score": 0.0, "judge_reference_score": 1.0, "judge": "gpt-4o-pairwise",
                 "user_rating": 1.0, "regenerated": false, "escalated": false}}

``usage`` also accepts the upstream response's usage as it is, in the shape of OpenAI Chat
Completions or Responses, Anthropic Messages (cache reads and 5-minute / 1-hour cache writes),
Gemini ``usageMetadata``, Bedrock Converse, DeepSeek, vLLM or SGLang (``pointsman/usage_shapes.py``).
Usage that cannot be priced (an unknown or mixed key, a missing prompt or output count, audio
tokens, ...) is an error naming each field; an outcome without ``usage`` books the decision's estimate.

Quality signals, all optional (``training/outcome_labels.py`` turns them into labels):

- ``judge_score``: a judge's score of this answer, on the judge's own scale (a 1–10
  rating, 0/1 correctness, or a 0–1 win score against a fixed reference answer);
- ``judge_reference_score``: the same judge's score of a reference answer to the same
  prompt, on the same scale (e.g. the frontier tier's answer);
- ``judge``: a name for the judge and its scale, so scores of different judges are never
  compared;
- ``user_rating``: the user's rating in [0, 1] (thumbs up = 1, down = 0; 1–5 stars as
  (stars − 1) / 4);
- ``regenerated``: the user asked for another answer; ``escalated``: the application retried
  the request on a stronger tier.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import ErrorDetails

from pointsman.errors import RequestError
from pointsman.json_types import JSONBool, json_path
from pointsman.usage_shapes import MAX_TOKENS, UsageProblems, read_usage

#: Outcome statuses: the answer arrived (``ok``), failed, timed out, or the client gave up.
STATUSES = ("ok", "error", "timeout", "cancelled")
#: Longest decision or outcome id accepted anywhere, characters: a signed id carries its claims
#: (``policy/signals/signed_ids.py``), whose budget scopes are up to three names of 200 characters (4 UTF-8
#: bytes each, 6 for an escaped control character), about 5,300 characters at most, 5,500 for an escalation's.
MAX_ID_CHARS = 8192
#: Ids (decision, outcome): 1–``MAX_ID_CHARS`` characters of letters, digits and ``_.:-+/@=``.
ID_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_.:+/@=-]{{0,{MAX_ID_CHARS - 1}}}$"
_ID = re.compile(ID_PATTERN)
#: A decision id's base, which begins it (``policy/signals/signed_ids.py``: 32 hex, then its claims and MAC).
_DECISION_BASE = re.compile(r"[0-9a-f]{32}(?![0-9a-f])")
#: Longest ``served_endpoint`` accepted, characters (a URL).
MAX_ENDPOINT_CHARS = 2048
#: Largest accepted batch in one call.
MAX_BATCH = 1000
#: Largest latency accepted (``ttft_ms``, ``tpot_ms``, ``e2e_latency_ms``): one day, in ms.
MAX_LATENCY_MS = 86_400_000.0
#: Largest ``time_s`` accepted (Unix seconds; the year 2286).
MAX_TIME_S = 1e10
#: Largest magnitude of a judge score (``judge_score``, ``judge_reference_score``).
MAX_JUDGE_SCORE = 1e9
#: An ``ok`` or failed outcome may report at most this many times the serving target's
#: ``context_window_tokens`` as ``prompt_tokens + completion_tokens`` (tokenizers differ between
#: the gateway's count and the engine's; beyond it the usage is impossible, ``check_usage_fits``).
CONTEXT_TOLERANCE = 1.1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


class Usage(BaseModel):
    """Token usage of the upstream call in the priced form (``pointsman/usage_shapes.py``):
    ``prompt_tokens`` (every prompt token), ``cached_tokens`` (cache reads), ``cache_write_tokens``
    (5-minute cache writes) and ``cache_write_1h_tokens`` (1-hour writes), parts of
    ``prompt_tokens``; ``completion_tokens`` (every output token, reasoning included); integers in
    [0, ``MAX_TOKENS``], each optional here (``OutcomeIn`` requires the prompt and output counts).
    Accepts any provider shape ``usage_shapes.read_usage`` reads (OpenAI Chat Completions and
    Responses, Anthropic, Gemini, Bedrock, DeepSeek, vLLM/SGLang); raises ``UsageProblems`` (a
    ``ValueError``) naming each field it cannot price. ``sources`` (not serialized): the field
    each count was read from; ``missing``: the prompt or output fields the usage lacks."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra={
        "additionalProperties": True,
        "description": "Pointsman's keys, or the upstream's usage as it is (OpenAI Chat Completions or Responses, "
                       "Anthropic Messages, Gemini usageMetadata, Bedrock Converse, DeepSeek, vLLM, SGLang); "
                       "with usage, both a prompt and an output count are required."})

    prompt_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    cached_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    completion_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    cache_write_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    cache_write_1h_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    sources: SkipJsonSchema[dict[str, str]] = Field(default_factory=dict, exclude=True, repr=False)
    missing: SkipJsonSchema[tuple[str, ...]] = Field(default=(), exclude=True, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _read_shape(cls, data: object) -> object:
        if not isinstance(data, Mapping):
            return data
        if "sources" in data or "missing" in data:
            raise UsageProblems([(f"usage.{k}", "unknown usage field: Pointsman cannot price it")
                                 for k in ("sources", "missing") if k in data])
        counts = read_usage(data)
        return {**counts.counts(), "sources": counts.sources, "missing": counts.missing}

    def source(self, count: str) -> str:
        """The field ``count`` (``cache_write_1h_tokens``) was read from, ``usage.<count>`` by default."""
        return self.sources.get(count, f"usage.{count}")


class QualitySignals(_Strict):
    """Quality signals for one answer (see the module docstring for each field)."""

    judge_score: float | None = Field(default=None, ge=-MAX_JUDGE_SCORE, le=MAX_JUDGE_SCORE)
    judge_reference_score: float | None = Field(default=None, ge=-MAX_JUDGE_SCORE, le=MAX_JUDGE_SCORE)
    judge: str | None = Field(default=None, max_length=128)
    user_rating: float | None = Field(default=None, ge=0.0, le=1.0)
    regenerated: JSONBool | None = None
    escalated: JSONBool | None = None

    def is_empty(self) -> bool:
        """True when no signal is set."""
        return all(v is None for v in self.model_dump().values())


class OutcomeIn(_Strict):
    """One outcome report (see the module docstring). Latencies in ms are finite, in [0,
    ``MAX_LATENCY_MS``]; ``time_s`` is Unix seconds in [0, ``MAX_TIME_S``]. Without ``status`` an
    outcome is ``ok``. A ``shadow`` outcome names its ``served_target`` (an error on that field without)."""

    decision_id: str
    outcome_id: str | None = None
    served_target: str | None = Field(default=None, max_length=128)
    served_model: str | None = Field(default=None, max_length=256)
    shadow: JSONBool = False
    status: Literal["ok", "error", "timeout", "cancelled"] = "ok"
    error: str | None = Field(default=None, max_length=1000)
    usage: Usage | None = None
    ttft_ms: float | None = Field(default=None, ge=0.0, le=MAX_LATENCY_MS)
    tpot_ms: float | None = Field(default=None, ge=0.0, le=MAX_LATENCY_MS)
    e2e_latency_ms: float | None = Field(default=None, ge=0.0, le=MAX_LATENCY_MS)
    time_s: float | None = Field(default=None, ge=0.0, le=MAX_TIME_S)
    quality: QualitySignals | None = None
    #: The endpoint that answered (None: the decision's), as the gateway names it: checked and made its fleet id
    #: by the service (``routes_reports.served_endpoint_id``; one the fleet does not have is kept as sent).
    served_endpoint: str | None = Field(default=None, min_length=1, max_length=MAX_ENDPOINT_CHARS)
    #: The upstream's HTTP status, for the outcome breaker (``counts_as_answered``).
    upstream_status: int | None = Field(default=None, ge=100, le=599, strict=True)

    @field_validator("decision_id", "outcome_id")
    @classmethod
    def _id(cls, v: str | None) -> str | None:
        if v is not None and not _ID.match(v):
            raise ValueError(f"must be 1-{MAX_ID_CHARS} characters of letters, digits and _.:-+/@= (starting with a "
                             "letter or digit)")
        return v

    @field_validator("upstream_status")
    @classmethod
    def _status_agrees(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and v >= 400 and info.data.get("status") == "ok":  # (absent: status itself failed)
            raise ValueError(f"{v} contradicts status 'ok' (an upstream {v} is no answer): report status 'error' "
                             "(or 'timeout'), with usage or ttft_ms when an answer was billed, or the status of the "
                             "call that answered")
        return v

    @model_validator(mode="after")
    def _usage_complete(self) -> OutcomeIn:
        if self.usage is not None and self.usage.missing:
            raise UsageProblems([(f, "missing: usage without both its prompt and output counts cannot be priced "
                                     "(omit usage to book the decision's estimate)") for f in self.usage.missing])
        return self

    @model_validator(mode="after")
    def _outcome_id_is_its_decisions(self) -> OutcomeIn:
        # a key beginning with another decision's id (its own outcome's key, a shadow's, or one its gateway derives
        # from it) would make that decision's outcome a conflict, stored and settled never: a decision id travels in
        # headers to the upstream, so another gateway key could keep a decision's spend off its budget
        base = _DECISION_BASE.match(self.outcome_id or "")
        if base is not None and not self.decision_id.startswith(base[0]):
            raise UsageProblems([("outcome_id", "begins with another decision's id, whose outcome it would take the "
                                                "place of: an outcome_id beginning with a decision id must begin "
                                                "with this outcome's decision_id")])
        return self

    @model_validator(mode="after")
    def _shadow_names_its_target(self) -> OutcomeIn:
        if self.shadow and self.served_target is None:  # (field, message) pairs, as for usage: the field named
            raise UsageProblems([("served_target", "required with shadow true: a shadow outcome is another model's "
                                                   "answer, and without its target it would be stored and labelled "
                                                   "as the decided target's")])
        return self

    @property
    def counts_as_answered(self) -> bool:
        """Whether the outcome breaker counts this outcome as its endpoint answering: ``ok``, or an upstream status
        below 500 but 408 and 429 (a 400/404/413/422 is the client's request refused, as Envoy's outlier
        detection counts 5xx only; 408 and 429 are the endpoint too slow or too busy)."""
        s = self.upstream_status
        return self.status == "ok" or (s is not None and s < 500 and s not in (408, 429))

    @property
    def key(self) -> str:
        """The idempotency key: ``outcome_id``, else ``decision_id`` for the decision's one outcome and
        ``<decision_id>/shadow:<served_target>`` for a shadow's (one per target), so a shadow outcome
        never takes the key of the outcome that settles the decision."""
        if self.outcome_id:
            return self.outcome_id
        return f"{self.decision_id}/shadow:{self.served_target}" if self.shadow else self.decision_id


class OutcomeItemError(RequestError):
    """One invalid outcome in a batch: a ``RequestError`` whose ``field``/``message`` are its first
    problem, and ``problems`` every ``(field, message)`` pair of the item (fields indexed into
    the batch, ``[1].status``). ``describe()`` is ``field: message`` of each, joined by ``; ``."""

    def __init__(self, problems: tuple[tuple[str | None, str], ...], *, decision_id: str | None = None,
                 outcome_id: str | None = None) -> None:
        super().__init__(problems[0][1], field=problems[0][0])
        self.problems = problems
        #: The item's ids when it sent valid ones (for its acknowledgement), else None.
        self.decision_id = decision_id
        self.outcome_id = outcome_id or decision_id

    def describe(self) -> str:
        """Every problem as ``field: message``, joined by ``; ``."""
        return "; ".join(f"{f}: {m}" if f else m for f, m in self.problems)


def _valid_id(value: object) -> str | None:
    return value if isinstance(value, str) and _ID.match(value) else None


def _item_error(exc: ValidationError, prefix: str, item: dict[str, object]) -> OutcomeItemError:
    """The ``OutcomeItemError`` for one item's validation errors (each error's field and message;
    unpriceable usage names each of its fields)."""
    problems: list[tuple[str | None, str]] = []
    for err in exc.errors(include_url=False):
        usage = (err.get("ctx") or {}).get("error")
        if isinstance(usage, UsageProblems):
            problems.extend((f"{prefix}.{f}" if prefix else f, m) for f, m in usage.problems)
        else:
            problems.append(field_problem(err, prefix))
    return OutcomeItemError(tuple(problems), decision_id=_valid_id(item.get("decision_id")),
                            outcome_id=_valid_id(item.get("outcome_id")))


def field_problem(err: ErrorDetails, prefix: str = "") -> tuple[str | None, str]:
    """``(field, message)`` of one pydantic error in a request body: the field's ``json_path``
    under ``prefix`` (None for the body as a whole) and pydantic's message (``unknown field``
    for a key the model forbids)."""
    msg = "unknown field" if err["type"] == "extra_forbidden" else str(err["msg"]).removeprefix("Value error, ")
    return json_path(err["loc"], prefix) or None, msg


def batch_items(body: object, noun: str) -> list[tuple[str, object]]:
    """The items of a body that is one JSON value or a list of them, each with the prefix its
    fields are named under (``[i]`` in a list, ``""`` for a single value). Raises
    ``RequestError`` for an empty list or one longer than ``MAX_BATCH`` (``noun``: what an item
    is, ``outcome``)."""
    if not isinstance(body, list):
        return [("", body)]
    if not body:
        raise RequestError(f"the {noun} list is empty; send at least one {noun}")
    if len(body) > MAX_BATCH:
        raise RequestError(f"{len(body)} {noun}s in one batch; the limit is {MAX_BATCH}")
    return [(f"[{i}]", item) for i, item in enumerate(body)]


def json_object(item: object, field: str = "") -> dict[str, object]:
    """``item`` when it is a JSON object; else raises ``RequestError`` naming ``field``."""
    if not isinstance(item, dict):
        raise RequestError(f"expected a JSON object, got {type(item).__name__}", field=field or None)
    return item


def parse_outcome_items(body: object) -> list[OutcomeIn | OutcomeItemError]:
    """Validate one outcome object or a list of them (at most ``MAX_BATCH``), item by item.

    Returns one entry per item, in order: the ``OutcomeIn``, or for an invalid item the
    ``OutcomeItemError`` naming its first offending field (``[3].usage.cached_tokens``; indexed
    when a list was sent) with all its problems in ``.problems`` (``(field, message)`` pairs).
    Raises ``RequestError`` for what no item can survive: an empty list, an oversized batch, a
    body or item that is not a JSON object. Unknown fields are errors (inside ``usage``: keys of no
    provider's shape, ``usage_shapes``).
    """
    out: list[OutcomeIn | OutcomeItemError] = []
    for prefix, value in batch_items(body, "outcome"):
        item = json_object(value, prefix)
        try:
            out.append(OutcomeIn.model_validate(item))
        except ValidationError as exc:
            out.append(_item_error(exc, prefix, item))
    return out


def parse_outcomes(body: object) -> list[OutcomeIn]:
    """Validate one outcome object or a list of them (at most ``MAX_BATCH``), all or nothing.

    Returns the outcomes in order. Raises ``RequestError`` whose ``field`` names the first
    offending field, indexed into the batch (``[3].usage.cached_tokens``) when a list was sent.
    Unknown fields are errors (inside ``usage``: keys of no provider's shape).
    """
    out: list[OutcomeIn] = []
    for item in parse_outcome_items(body):
        if isinstance(item, OutcomeItemError):
            raise item
        out.append(item)
    return out


def check_usage_fits(usage: Usage | None, context_window_tokens: int, target: str,
                     prefix: str = "", decided_tokens: int = 0) -> OutcomeItemError | None:
    """Whether reported usage is possible on a target whose context window is
    ``context_window_tokens``: ``prompt_tokens + completion_tokens`` (missing counts as 0) must
    be at most the larger of the window and ``decided_tokens`` (the decision's own prompt tokens and
    output cap: a Completions batch's prompts and ``n`` answers are sequences of their own, each within
    the window, their sum not), times ``CONTEXT_TOLERANCE`` (tokenizers differ). Returns None when
    it fits, else the ``OutcomeItemError`` naming ``usage.prompt_tokens`` or ``usage.completion_tokens``
    (whichever alone is beyond the limit) or ``usage`` (their sum), under ``prefix`` (``[3]``)."""
    if usage is None:
        return None
    prompt, completion = usage.prompt_tokens or 0, usage.completion_tokens or 0
    limit = int(max(context_window_tokens, decided_tokens) * CONTEXT_TOLERANCE)
    if prompt + completion <= limit:
        return None
    name = "usage.prompt_tokens" if prompt > limit else "usage.completion_tokens" if completion > limit else "usage"
    field = f"{prefix}.{name}" if prefix else name
    msg = (f"prompt_tokens + completion_tokens = {prompt + completion:,} is impossible on target '{target}': its "
           f"context window is {context_window_tokens:,} tokens (at most {limit:,} accepted, x{CONTEXT_TOLERANCE})")
    return OutcomeItemError(((field, msg),))  # ids: the caller's OutcomeIn has them
