"""The routing request: an OpenAI-style chat request plus Pointsman's routing context.

One schema serves the HTTP API, the CLI and trace replay. OpenAI fields that do
not affect routing (temperature, stream, ...) are accepted and
ignored so a gateway can forward its request unchanged (``response_format`` is read: a frontier
target's prompt counts its schema); Pointsman's own ``routing`` object rejects unknown keys.

``parse_route_request(body)`` validates a JSON-like mapping and raises
``RequestError`` whose ``field`` names the offending field (``messages[1].content[0].type``).

``canonical(text)`` is the one form of every string Pointsman compares as an identity (tenant, team,
session id, SLO class, budget scope and key names, tenant allow-lists): Unicode NFC with the
default-ignorable code points (zero-width spaces and joiners, soft hyphens, BOMs, variation
selectors, bidi controls; Unicode's ``Default_Ignorable_Code_Point``) removed, so look-alike spellings
are one identity. The routing fields are canonical once validated; one that is empty once
normalised is refused.

``RequestView.of(request, api_key_id)`` normalises a validated request once for everything
downstream: the text of each message (and its UTF-8, encoded once), the rendering prefix hashing reads, the transcript the
outcome log hashes, and the budget scopes. The engine builds one per decision; features,
signals, prefix hashes, dispatch and the decision log all read it.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import unicodedata
import weakref
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from pointsman.errors import RequestError
from pointsman.json_types import JSONBool, JSONObject, JSONValue, json_path
from pointsman.media import InflateBudget, Media, audio_seconds, file_size, image_size, inline_data

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


#: Unicode's ``Default_Ignorable_Code_Point`` (DerivedCoreProperties.txt): invisible when rendered.
_IGNORABLE = re.compile("[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
                        "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3"
                        "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]")


def canonical(text: str) -> str:
    """``text`` as one identity: default-ignorable code points removed, then Unicode NFC (see the module)."""
    if text.isascii():
        return text
    return unicodedata.normalize("NFC", _IGNORABLE.sub("", text))


def _identity(value: str | None) -> str | None:
    """A routing identity field, canonical; refuses one that is empty, or empty once normalised (an empty
    tenant or team would silently drop its budget scope: leave the field out when there is none)."""
    if value is None:
        return value
    if not value:
        raise ValueError("is empty: leave the field out (or null) when there is none")
    out = canonical(value)
    if not out:
        raise ValueError("has only invisible characters (zero-width or other default-ignorable code points)")
    return out


def _check_utf8(value: str, what: str = "text", keep: bool = False) -> str:
    """Reject strings that cannot be encoded as UTF-8 (lone surrogates from invalid bytes). ``keep``: inside
    ``parse_route_request``, a text of ``_KEPT_UTF8_CHARS`` or more keeps its encoding (by its ``id``) for
    ``RequestView.utf8``, so a long text is not encoded twice."""
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid UTF-8 (bad character at offset {exc.start})") from None
    if keep and len(value) >= _KEPT_UTF8_CHARS and (kept := _KEEPING.get()) is not None:
        kept[id(value)] = (value, encoded)
    return value


#: ``id(text)`` -> (text, its UTF-8): the encodings ``_check_utf8`` kept while one request was validated.
_Encoded = dict[int, tuple[str, bytes]]
#: ``id(request)`` -> (a weak reference to it, its texts' kept encodings), for ``RequestView.utf8``; an entry
#: leaves with its request (kept outside the model: a private attribute costs every request ~3 µs to set up).
_KEPT: dict[int, tuple[weakref.ref[RouteRequest], _Encoded]] = {}


def _keep(request: RouteRequest, encoded: _Encoded) -> None:
    """Keep ``encoded`` for ``request`` until it is freed."""
    rid = id(request)
    _KEPT[rid] = (weakref.ref(request, lambda _: _KEPT.pop(rid, None)), encoded)


def _kept(request: RouteRequest) -> _Encoded | None:
    """The encodings kept for ``request`` (None: none)."""
    got = _KEPT.get(id(request))
    return got[1] if got is not None and got[0]() is request else None


#: Where ``_check_utf8`` keeps long texts' encodings while ``parse_route_request`` validates (None elsewhere).
_KEEPING: ContextVar[_Encoded | None] = ContextVar("pointsman_request_utf8", default=None)
#: Shortest text whose encoding ``_check_utf8`` keeps for ``RequestView.utf8`` (shorter ones cost less to
#: encode again than to look up).
_KEPT_UTF8_CHARS = 4096


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextPart(_Part):
    """``{"type": "text", "text": "..."}``."""

    type: Literal["text"]
    text: str

    @field_validator("text")
    @classmethod
    def _utf8(cls, v: str) -> str:
        return _check_utf8(v, "text", True)


class ImagePart(_Part):
    """``{"type": "image_url", "image_url": {"url": ...}}``; an inline image's size is read from its header
    (``RequestView.media``)."""

    type: Literal["image_url", "image"]
    image_url: JSONValue = None


class AudioPart(_Part):
    """``{"type": "input_audio", "input_audio": {"data": base64, "format": ...}}``: its length is read for the
    cost (``RequestView.media``), not for ``prompt_tokens``; the request needs a target with ``capabilities.audio``."""

    type: Literal["input_audio"]


class FilePart(_Part):
    """``{"type": "file", "file": {"file_data": data URL | "file_id": ...}}`` (a PDF, ...): its pages are read for
    the cost (``RequestView.media``), not for ``prompt_tokens``; the request needs a target with ``capabilities.files``."""

    type: Literal["file"]


class RefusalPart(_Part):
    """``{"type": "refusal", "refusal": "..."}`` in assistant messages."""

    type: Literal["refusal"]
    refusal: str = ""


ContentPart = Annotated[
    TextPart | ImagePart | AudioPart | FilePart | RefusalPart, Field(discriminator="type")
]


class FunctionCall(BaseModel):
    """A tool call's function (or an assistant message's legacy ``function_call``): ``name`` and JSON ``arguments``
    (a string)."""

    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str = ""

    _utf8 = field_validator("arguments")(lambda cls, v: _check_utf8(v))


class ToolCall(BaseModel):
    """An assistant's tool call; ``function.arguments`` is a JSON string (counted as prompt text)."""

    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: str = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One chat message; ``content`` is a string, a list of parts, or null (tool-call-only turns)."""

    model_config = ConfigDict(extra="allow")
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    function_call: FunctionCall | None = None  # OpenAI's deprecated tool_calls: billed as input the same

    @field_validator("content", mode="before")
    @classmethod
    def _content_shape(cls, v: object) -> object:
        if v is None or isinstance(v, list):
            return v
        if isinstance(v, str):
            return _check_utf8(v, "content", True)
        raise ValueError(f"content must be a string, a list of content parts or null, not {type(v).__name__}")

    def text(self) -> str:
        """All text of this message (string content, text parts, refusals, tool-call and function-call arguments)."""
        if isinstance(self.content, str) and not self.tool_calls and self.function_call is None:
            return self.content  # the usual message: its string, as the join gives it
        chunks: list[str] = []
        if isinstance(self.content, str):
            chunks.append(self.content)
        elif self.content:
            for part in self.content:
                if isinstance(part, TextPart):
                    chunks.append(part.text)
                elif isinstance(part, RefusalPart):
                    chunks.append(part.refusal)
        for call in self.tool_calls or ():
            chunks.append(f"{call.function.name}({call.function.arguments})")
        if self.function_call is not None:
            chunks.append(f"{self.function_call.name}({self.function_call.arguments})")
        return "\n".join(c for c in chunks if c)

    def n_images(self, detail: str | None = None) -> int:
        """Number of image parts in this message; with ``detail``, of those whose ``image_url.detail`` is it."""
        if isinstance(self.content, list):
            return sum(isinstance(p, ImagePart) and (detail is None or (isinstance(p.image_url, dict)
                                                                          and p.image_url.get("detail") == detail))
                       for p in self.content)
        return 0

    def has_part(self, kind: type[AudioPart] | type[FilePart]) -> bool:
        """Whether the content has a part of ``kind`` (``AudioPart``, ``FilePart``)."""
        return isinstance(self.content, list) and any(isinstance(p, kind) for p in self.content)

    def cache_marks(self) -> list[object]:
        """The ``cache_control`` values (prompt-cache breakpoints, Anthropic's explicit prompt caching as
        LiteLLM passes it) on this message and on its content parts, in order; [] when none."""
        owners = [self, *(self.content if isinstance(self.content, list) else ())]
        return [o.model_extra["cache_control"] for o in owners if o.model_extra and "cache_control" in o.model_extra]


def _not_bool(v: object) -> object:
    """JSON ``true``/``false`` is not a count: pydantic's lax mode would read it as 1/0."""
    if isinstance(v, bool):
        raise ValueError("expected an integer, got a boolean")
    return v


#: An integer field that rejects booleans (otherwise lenient: ``"5"`` and ``5.0`` still pass).
Count = Annotated[int, BeforeValidator(_not_bool)]


class RoutingContext(BaseModel):
    """Pointsman's own routing context; unknown keys are rejected.

    ``prefix_block_hashes``: block hashes of the prompt prefix computed by the gateway
    (as in Mooncake traces' ``hash_ids``), oldest block first.
    ``prompt_tokens``: the gateway's exact prompt token count, if it has one.
    ``tenant`` / ``team``: who the request is for; budgets apply per tenant and team
    (scopes ``tenant:<tenant>``, ``team:<team>``; see ``policy/budget/``).
    ``batch``: the request is a batch of independent prompts (a Completions ``prompt`` list, as the
    endpoint picker reads it): the text parts of its one user message, each its own sequence on the
    engine, so the context window must hold the longest of them (and the output cap), not all of them;
    ``prompt_tokens`` still counts them all.
    """

    model_config = ConfigDict(extra="forbid")
    tenant: str | None = Field(default=None, max_length=256)
    team: str | None = Field(default=None, max_length=256)
    session_id: str | None = Field(default=None, max_length=256)
    slo_class: str | None = Field(default=None, max_length=64)
    prefix_block_hashes: list[Count | str] | None = Field(default=None, max_length=100_000)
    prompt_tokens: Count | None = Field(default=None, ge=0)
    explain: JSONBool = False
    batch: JSONBool = False

    _identities = field_validator("tenant", "team", "session_id", "slo_class")(lambda cls, v: _identity(v))

    @field_validator("explain", "batch", mode="before")
    @classmethod
    def _null_flag(cls, v: object) -> object:
        return False if v is None else v


class RouteRequest(BaseModel):
    """An OpenAI-style chat request plus ``routing`` context.

    Extra top-level OpenAI fields (temperature, stream, ...) are ignored.
    ``max_tokens`` / ``max_completion_tokens``: the output token cap, if the client set one.
    ``n``: OpenAI's number of answers (choices, 1-128): each is decoded and billed as output, the
    prompt once, so the expected output (cost and decode time) is ``n`` answers' worth.
    ``modalities`` / ``audio``: OpenAI's output modalities and audio output parameters (``has_audio``).
    ``previous_response_id`` / ``conversation``: the OpenAI Responses API's continuation of state the provider
    stored (a response id; a conversation id, or an object with its ``id``): see ``stored_state``.
    ``cache_salt``: vLLM's per-request prefix-cache salt (its Chat Completions and Completions extension): the
    engine mixes it into the hash of the prompt's first block, so only requests with the same salt share cached
    blocks (``engine_hashes.EngineHasher.digests``).
    ``response_format``: OpenAI's structured output format (``{"type": "json_schema", "json_schema": {...}}``; a
    Responses body's ``text.format``, ``ext_proc_body.chat_request``), any JSON: a frontier provider puts a schema in
    the model's input and bills it as input, so a frontier target's prompt counts it (``cost.target_prompt_tokens``);
    vLLM enforces it by constrained decoding, outside the prompt, so the request's ``prompt_tokens`` does not.
    ``prompt``: a Completions body's ``prompt`` as sent, beside the user message ``ext_proc_body.chat_request``
    makes of it (``completions_prompt``); any other value (a Responses ``prompt`` template object) is not read.
    """

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1, max_length=100_000)
    tools: list[JSONObject] | None = None
    max_tokens: Count | None = Field(default=None, ge=1)
    max_completion_tokens: Count | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1, le=128)
    user: str | None = None
    modalities: list[str] | None = None
    audio: JSONObject | None = None
    previous_response_id: str | None = None
    conversation: str | JSONObject | None = None
    cache_salt: str | None = None
    response_format: JSONValue = None
    prompt: JSONValue = None
    routing: RoutingContext = Field(default_factory=RoutingContext)

    @model_validator(mode="before")
    @classmethod
    def _legacy_functions(cls, data: object) -> object:
        """OpenAI's deprecated ``functions`` (function definitions, billed as input as ``tools`` are) read as tools
        of type ``function`` after the request's ``tools``: counted in the prompt, and needing ``capabilities.tools``.
        Before, they were ignored, and 40,000 tokens of them priced a request at 6 tokens."""
        if isinstance(data, dict) and isinstance(functions := data.get("functions"), list) and functions \
                and isinstance(tools := data.get("tools") or [], list):
            data = {**data, "tools": [*tools, *({"type": "function", "function": f} for f in functions)]}
        return data

    @field_validator("routing", mode="before")
    @classmethod
    def _null_routing(cls, v: object) -> object:
        """``"routing": null`` means no routing context."""
        return {} if v is None else v

    @property
    def completions_prompt(self) -> str | list[int] | None:
        """The one prompt of a Completions request as its engine reads it: its text, or its token ids; None for a
        chat request, a batch of prompts or anything else."""
        p = self.prompt
        if isinstance(p, str):
            return p
        if isinstance(p, list) and p and all(type(i) is int for i in p):
            return [i for i in p if type(i) is int]
        return None

    @property
    def max_output_tokens(self) -> int | None:
        """The output token cap: ``max_completion_tokens`` if set, else ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def stored_state(self) -> str | None:
        """The field by which the request continues state its provider stored: ``previous_response_id`` or
        ``conversation`` (the Responses API prepends that response's or conversation's items to ``input``,
        and bills them as input), ``prompt`` (a prompt template the provider stored, its text billed as input)
        or ``item_reference`` (an input item naming a stored item), the last two as
        ``ext_proc_body.chat_request`` marks their messages' ``type``; None when it stands alone (an empty id is
        none). Only a target holding that state can serve it (``fleet.holds_stored_state``), and its counted
        prompt is a lower bound."""
        if self.previous_response_id:
            return "previous_response_id"
        if self.conversation:
            return "conversation"
        marks = [m.model_extra.get("type") for m in self.messages if m.model_extra]
        return next((mark for mark in ("prompt", "item_reference") if mark in marks), None)

    def uncounted_input(self) -> list[str]:
        """What the provider bills as input that the prompt token count (so ``prompt_tokens_upper`` and the cost
        estimate too: lower bounds) leaves out, in order: ``stored state (<field>)`` (``stored_state``),
        ``file parts``, ``audio parts``; [] when every input is counted. The decision's trace reports it as
        ``uncounted_input`` (none when the gateway sent the count, ``routing.prompt_tokens``)."""
        out = [f"stored state ({field})"] if (field := self.stored_state) else []
        return out + [what for kind, what in ((FilePart, "file parts"), (AudioPart, "audio parts"))
                      if self.has_part(kind)]

    def has_content(self) -> bool:
        """True when any message carries text, an image, audio, a file or a tool call."""
        return any(m.text().strip() or m.n_images() or m.tool_calls or m.has_part(AudioPart) or m.has_part(FilePart)
                   for m in self.messages)

    def batch_prompts(self) -> list[ContentPart]:
        """The prompts of a batch (``routing.batch``): its first message's content parts (a string content is
        one prompt); [] for a request that is no batch."""
        if not self.routing.batch:
            return []
        content = self.messages[0].content
        return [TextPart(type="text", text=content)] if isinstance(content, str) else list(content or ())

    def has_part(self, kind: type[AudioPart] | type[FilePart]) -> bool:
        """Whether any message has a content part of ``kind`` (``AudioPart``, ``FilePart``)."""
        return any(m.has_part(kind) for m in self.messages)

    def has_audio(self) -> bool:
        """Whether the request needs a model that takes audio: an ``input_audio`` part, an audio answer
        asked (``"audio"`` in ``modalities``, or ``audio`` output parameters), or an earlier audio answer
        referenced (an assistant message's ``audio: {"id": ...}``)."""
        return self.has_part(AudioPart) or "audio" in (self.modalities or ()) or self.audio is not None \
            or any(m.model_extra is not None and m.model_extra.get("audio") is not None for m in self.messages)

    def cache_marks(self) -> list[object]:
        """The ``cache_control`` values on the tools, the messages and their content parts: the prompt-cache
        breakpoints a provider with explicit prompt caching (``FrontierTarget.prompt_cache``: Anthropic)
        caches up to; [] when none."""
        marks = [t["cache_control"] for t in self.tools or () if isinstance(t, dict) and "cache_control" in t]
        return marks + [c for m in self.messages for c in m.cache_marks()]


def has_1h_mark(marks: list[object]) -> bool:
    """Whether one of the ``cache_control`` values ``marks`` (``RouteRequest.cache_marks``) asks Anthropic's 1-hour
    cache lifetime (``cache_control: {ttl: "1h"}``), whose write is priced higher
    (``usd_per_1m_cache_write_1h_input_tokens``; 2 x input) than the 5-minute one."""
    return any(isinstance(c, dict) and c.get("ttl") == "1h" for c in marks)


def _is_branch_label(item: object) -> bool:
    """Pydantic puts union branch names (``str``, ``list[tagged-union[...]]``) into error locations."""
    return isinstance(item, str) and ("[" in item or item in {"str", "int", "list", "dict", "none"})


def _loc(loc: tuple[int | str, ...]) -> str:
    items = [i for i in loc if not _is_branch_label(i)]
    # A tagged union repeats the tag after the list index: (..., 0, "text", "text") -> (..., 0, "text").
    cleaned: list[int | str] = []
    for i, item in enumerate(items):
        prev_is_index = i > 0 and isinstance(items[i - 1], int)
        if prev_is_index and isinstance(item, str) and i + 1 < len(items) and isinstance(items[i + 1], str):
            continue
        cleaned.append(item)
    return json_path(cleaned)


def _message(err: ErrorDetails) -> str:
    """A readable message for one pydantic error (unknown routing keys get "did you mean")."""
    kind, loc = err["type"], tuple(err["loc"])
    if kind == "extra_forbidden":
        allowed = list(RoutingContext.model_fields)
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return f"unknown field; {hint}routing accepts {', '.join(allowed)}"
    if kind == "too_short" and loc == ("messages",):
        return "the message list is empty; send at least one message"
    return str(err["msg"]).removeprefix("Value error, ")


def parse_route_request(body: object) -> RouteRequest:
    """Validate a JSON-like mapping into a ``RouteRequest``.

    Raises ``RequestError`` naming the first offending field (e.g.
    ``messages[0].content[1].type``), or ``"messages"`` when no message has any content.
    """
    if not isinstance(body, dict):
        raise RequestError(f"expected a JSON object, got {type(body).__name__}")
    encoded: _Encoded = {}
    token = _KEEPING.set(encoded)  # (a validation context costs ~3 µs a request; a context variable does not)
    try:
        request = RouteRequest.model_validate(body)
    except ValidationError as exc:
        # The deepest location is the most specific one (union branches report at equal depth).
        err = max(exc.errors(include_url=False), key=lambda e: len(e["loc"]))
        # Discriminated unions add the tag to loc; keep it readable.
        raise RequestError(_message(err), field=_loc(tuple(err["loc"])) or None) from None
    finally:
        _KEEPING.reset(token)
    if not request.has_content():
        raise RequestError("prompt is empty: no message has text, images, audio, files or tool calls",
                           field="messages")
    if request.routing.batch and (len(request.messages) != 1 or request.messages[0].role != "user"
                                  or not all(isinstance(p, TextPart) for p in request.batch_prompts())):
        raise RequestError("a batch is one user message whose text parts are its prompts", field="routing.batch")
    if encoded:
        _keep(request, encoded)
    return request


def request_from_prompt(prompt: str, **routing: JSONValue) -> RouteRequest:
    """A one-turn user request from a plain prompt string; raises ``RequestError`` if empty."""
    return parse_route_request({"messages": [{"role": "user", "content": prompt}], "routing": routing})


#: Longest name of a budget scope (``tenant:<name>``, ``team:<name>``, ``key:<name>``), in characters.
MAX_SCOPE_NAME_CHARS = 200


def valid_scope_name(name: str) -> bool:
    """Whether ``name`` may name a budget scope: 1 to ``MAX_SCOPE_NAME_CHARS`` characters, no whitespace,
    and ``canonical`` (a key name written NFD or with a zero-width space would be a second identity)."""
    return 0 < len(name) <= MAX_SCOPE_NAME_CHARS and not any(c.isspace() for c in name) and canonical(name) == name


def request_scopes(tenant: str | None, team: str | None, api_key_id: str | None = None) -> tuple[str, ...]:
    """Budget scopes of a request: ``tenant:<tenant>``, ``team:<team>``, ``key:<api key id>`` for
    those present. Raises ``RequestError`` naming the routing field when a name has spaces
    or is over 200 characters (scopes are ``kind:name`` with a non-space name)."""
    out = []
    for kind, value, fld in (("tenant", tenant, "routing.tenant"), ("team", team, "routing.team"),
                             ("key", api_key_id, "api_key_id")):
        if not value:
            continue
        if not valid_scope_name(value):
            raise RequestError(f"{kind} must be 1-200 characters without spaces (it names a budget scope)",
                               field=fld)
        out.append(f"{kind}:{value}")
    return tuple(out)


@dataclass(frozen=True, eq=False)
class RequestView:
    """One validated request, normalised once for every consumer (see the module docstring).

    ``request``: the ``RouteRequest``; ``texts``: ``ChatMessage.text()`` of each message, in
    order (computed once: the features, the renderings and the query window read them);
    ``api_key_id``: the caller's API key id (None: no key). ``scopes``, ``utf8`` (the texts in UTF-8, encoded
    once) and the renderings are computed on first use. Build with ``RequestView.of``.
    """

    request: RouteRequest
    texts: tuple[str, ...]
    api_key_id: str | None = None

    @classmethod
    def of(cls, request: RouteRequest, api_key_id: str | None = None) -> RequestView:
        """The view of ``request`` made on behalf of ``api_key_id`` (None: no key)."""
        return cls(request, tuple(m.text() for m in request.messages), api_key_id)

    @cached_property
    def scopes(self) -> tuple[str, ...]:
        """The budget scopes: ``request_scopes`` of the routing tenant and team and the API key
        id. Raises ``RequestError`` naming ``routing.tenant``, ``routing.team`` or ``api_key_id``
        when a scope name is unusable."""
        return request_scopes(self.routing.tenant, self.routing.team, self.api_key_id)

    @property
    def routing(self) -> RoutingContext:
        """The request's ``routing`` context."""
        return self.request.routing

    @cached_property
    def media(self) -> Media:
        """The sizes of the request's image, audio and file parts, in order (``media.Media``; a part that cannot be
        read: None), read on first use: only a request with such parts reads it (``cost.target_prompt_tokens``).
        An assistant message's ``audio: {"id": ...}`` (OpenAI bills that earlier answer's audio again) is an audio
        part of unknown size. An image's detail is its ``image_url.detail`` (or the part's ``detail``). Pure; no errors."""
        images: list[tuple[tuple[int, int] | None, str | None]] = []
        audio: list[float | None] = []
        files: list[tuple[int | None, bool]] = []
        inflate = InflateBudget()  # one for all the request's PDFs
        for m in self.request.messages:
            if isinstance(said := (m.model_extra or {}).get("audio"), dict) and "id" in said:
                audio.append(None)  # an earlier answer's audio (``audio: {id}``), billed again: size not known
            for part in m.content if isinstance(m.content, list) else ():
                extra = part.model_extra or {}
                if isinstance(part, ImagePart):
                    ref = part.image_url if part.image_url is not None else extra.get("source")
                    detail = ref.get("detail", extra.get("detail")) if isinstance(ref, dict) else extra.get("detail")
                    images.append((image_size(inline_data(ref)), detail if isinstance(detail, str) else None))
                elif isinstance(part, AudioPart):
                    ref = extra.get("input_audio")
                    audio.append(audio_seconds(inline_data(ref), ref.get("format") if isinstance(ref, dict) else None))
                elif isinstance(part, FilePart):
                    ref = extra.get("file") or extra.get("source")
                    text = ref.get("data") if isinstance(ref, dict) and ref.get("type") == "text" else None
                    files.append((len(text.encode("utf-8", "replace")), False) if isinstance(text, str)  # Anthropic's
                                 else file_size(inline_data(ref), inflate))  # plain-text document: its bytes bound its tokens
        return Media(tuple(images), tuple(audio), tuple(files))

    @cached_property
    def utf8(self) -> tuple[bytes, ...]:
        """``texts`` in UTF-8, each encoded once (raises ``UnicodeEncodeError`` for a lone surrogate, which
        ``parse_route_request`` refuses): what the token bound's byte scan, the prefix block hashes, the cache
        signals' byte lengths and the decision log's ``prompt_sha256`` read, so the conversation is neither
        copied into other strings nor encoded again for each of them (at 100k tokens each copy is ~0.4 MB, and
        a decision the cascade holds kept them all)."""
        kept = _kept(self.request) if _KEPT else None
        if not kept:
            return tuple(text.encode("utf-8") for text in self.texts)
        return tuple(got[1] if (got := kept.get(id(text))) is not None and got[0] is text else text.encode("utf-8")
                     for text in self.texts)

    @property
    def session_key(self) -> tuple[str | None, str | None, str] | None:
        """(API key id, tenant, session id) of a request naming ``routing.session_id``, else None: the key of
        its conversation's last text (``session_texts``), so one caller's session never meets another's."""
        r = self.routing
        return (self.api_key_id, r.tenant, r.session_id) if r.session_id else None

    @cached_property
    def tools_utf8(self) -> bytes:
        """``conversation_utf8``'s first piece: ``tools\n<tools>\n`` in UTF-8 (b"" without tools)."""
        return f"tools\n{self.request.tools!r}\n".encode() if self.request.tools else b""

    def _segments_utf8(self) -> list[bytes]:
        """``conversation_utf8``'s pieces: the tools' segment (when any), then ``role\n``, the text and
        ``\n`` per message."""
        out = [self.tools_utf8] if self.request.tools else []
        for m, text in zip(self.request.messages, self.utf8):
            out += (m.role.encode(), b"\n", text, b"\n")
        return out

    @cached_property
    def cache_breakpoint_bytes(self) -> int:
        """Bytes of ``conversation_utf8`` up to the last ``cache_control`` breakpoint (0 when none): what a
        provider with explicit prompt caching caches. A mark on the tools ends after them; one on a message
        or on its last part ends after that message; one on an earlier part ends before the message (its
        place inside the message's text is not kept: the cached prefix is counted short, the safe side)."""
        end = cut = 0
        if self.request.tools:
            end = len(self.tools_utf8)
            cut = end if any(isinstance(t, dict) and "cache_control" in t for t in self.request.tools) else 0
        for m, text in zip(self.request.messages, self.utf8):
            start, end = end, end + len(m.role) + len(text) + 2  # role\ntext\n (roles are ASCII)
            parts = m.content if isinstance(m.content, list) else []
            last_marked = bool(parts) and "cache_control" in (parts[-1].model_extra or {})
            if "cache_control" in (m.model_extra or {}) or last_marked:
                cut = end
            elif m.cache_marks():  # a mark on an earlier part
                cut = max(cut, start)
        return cut

    @property
    def conversation_utf8(self) -> bytes:
        """The conversation for prefix hashing, ``role\ntext\n`` per message (tools declared first), in UTF-8,
        joined from ``utf8``: two requests sharing a conversation prefix share a byte prefix (not kept: the prefix
        block hashes read it once; ``conversation_bytes`` is its length)."""
        return b"".join(self._segments_utf8())

    @cached_property
    def conversation_bytes(self) -> int:
        """``len(conversation_utf8)``, without joining it: the cache signals' byte length."""
        return len(self.tools_utf8) + sum(len(m.role) + len(text) + 2  # role\ntext\n (roles are ASCII)
                                              for m, text in zip(self.request.messages, self.utf8))

    def prompt_sha256(self) -> str:
        """sha256 hex (64 chars) of ``transcript`` in UTF-8, hashed from ``utf8`` piece by piece (the
        transcript is not built)."""
        h = hashlib.sha256()
        for i, (m, text) in enumerate(zip(self.request.messages, self.utf8)):
            h.update(f"\n{m.role}: ".encode() if i else f"{m.role}: ".encode())
            h.update(text)
        return h.hexdigest()

    @cached_property
    def transcript(self) -> str:
        """The conversation as ``role: text`` lines joined by newlines: what the decision log's
        ``prompt_sha256`` hashes (kept stable across versions, so logged hashes compare)."""
        return "\n".join(f"{m.role}: {text}" for m, text in zip(self.request.messages, self.texts))
