"""Bodies the endpoint picker reads and writes (``service/ext_proc.py``): the request body
collected within a size limit and rewritten for the decision, and usage read from the response
body, JSON or a server-sent-event (SSE) stream. Plain functions of bytes; no protobuf, no I/O.

- ``BodyBuffer(limit_bytes)``: chunks appended until ``limit_bytes`` (the service's
  ``POINTSMAN_MAX_BODY_BYTES``, 8 MiB by default); ``add`` returns False once a chunk would pass it.
- ``rewrite_request(raw, body, model)``: the bytes to forward — ``model`` set to the decision's
  upstream model, Pointsman's own ``routing`` object removed (an upstream engine does not know it);
  None when nothing changes. The ``model`` value is spliced into the original bytes when the key
  ``"model"`` (in any JSON spelling) occurs once (about 0.01 ms on a 100,000-token body); otherwise the body is
  re-serialized (``json.dumps``, a few ms at that size).
- ``UsageReader(sse, limit_bytes, encoding)``: fed the response body chunk by chunk; ``summary()`` gives
  ``ResponseSummary(usage, model, complete)``. A body sent with ``content-encoding: gzip`` or ``deflate``
  (OpenAI compresses when the client accepts it, and Envoy hands ext_proc the encoded bytes) is decoded
  as it comes; another encoding (``br``, ``zstd``) cannot be read (``undecodable``: no usage). JSON
  bodies are kept up to ``limit_bytes`` (decoded) and parsed at the end; an SSE stream is read line
  by line (``data: {...}`` events; the last event carrying ``usage`` wins; ``data: [DONE]`` marks a
  complete stream), holding at most one unfinished line of up to ``limit_bytes``.

Usage is kept in the upstream's own shape (``pointsman/usage_shapes.py`` reads and prices it):
``usage`` of a Chat Completions / Completions / Responses / Anthropic Messages / Bedrock Converse
body, ``usageMetadata`` of a Gemini body, at the top level or under ``response`` (the Responses
API's ``response.completed`` event) or ``message`` (Anthropic's ``message_start``). In a stream,
the usage objects of successive events are merged key by key, later events winning: OpenAI's
final chunk (``stream_options.include_usage``) or vLLM's per-chunk ``continuous_usage_stats``,
Anthropic's ``message_start`` (input and cache counts) then ``message_delta`` (the output count),
Gemini's cumulative ``usageMetadata``. ``data: [DONE]``, ``response.completed`` /
``response.incomplete`` and Anthropic's ``message_stop`` mark a complete stream.

A stream without usage (OpenAI's Chat Completions streams carry none unless the client asks with
``stream_options.include_usage``) still shows its length: ``streamed_tokens`` counts the non-empty
text values its events stream (``content``, ``text``, ``delta``, ``arguments``, ``reasoning_content``,
``partial_json``, ``thinking``), each at least one token, so it is a lower bound of the output tokens
(an engine may send several tokens per event).
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from typing import TypeGuard

from pointsman.errors import RequestError
from pointsman.json_types import JSONObject, JSONValue

#: Content encodings the usage reader decodes (zlib: gzip, and deflate in the zlib format) and the identity ones.
DECODED_ENCODINGS = frozenset({"gzip", "x-gzip", "deflate"})
IDENTITY_ENCODINGS = frozenset({"", "identity"})
#: Most decoded bytes produced per step (an encoded chunk may expand a thousandfold).
_DECODE_STEP_BYTES = 65536

#: A streamed piece of output: a non-empty string value of a key a stream's deltas carry text in.
_STREAMED = re.compile(rb'"(?:content|text|delta|arguments|reasoning_content|partial_json|thinking)"\s*:\s*"(?!")')
#: A key ``"model"``, each letter as it is or ``\\u``-escaped (``"m\\u006fdel"`` is the same key), followed by a
#: JSON string value; group 1 is the value with its quotes.
_MODEL = re.compile(rb'"(?:m|\\u006[dD])(?:o|\\u006[fF])(?:d|\\u0064)(?:e|\\u0065)(?:l|\\u006[cC])"\s*:\s*("(?:[^"\\]|\\.)*")')


class BodyBuffer:
    """A request or response body collected chunk by chunk, at most ``limit_bytes`` long."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._parts: list[bytes] = []
        self.size = 0

    def add(self, chunk: bytes) -> bool:
        """Append ``chunk``; False (and nothing appended) when the body would pass the limit."""
        if self.size + len(chunk) > self.limit_bytes:
            return False
        if chunk:
            self._parts.append(chunk)
            self.size += len(chunk)
        return True

    def value(self) -> bytes:
        """The body so far."""
        if len(self._parts) > 1:
            self._parts = [b"".join(self._parts)]
        return self._parts[0] if self._parts else b""


def rewrite_request(raw: bytes, body: JSONObject, model: str | None) -> bytes | None:
    """The request bytes to forward (see the module), or None when ``raw`` goes as it is.
    ``body`` is ``raw`` parsed (a JSON object); ``model``: the upstream model to set (None: keep)."""
    change_model = model is not None and body.get("model") != model
    if "routing" not in body and not change_model:
        return None
    if "routing" not in body and model is not None:
        found = list(_MODEL.finditer(raw))
        if len(found) == 1:  # one "model" key: the top-level one (the body has it, or the scan found a nested one)
            m = found[0]
            if json.loads(m.group(1)) == body.get("model"):
                return raw[:m.start(1)] + json.dumps(model).encode() + raw[m.end(1):]
    out: JSONObject = {k: v for k, v in body.items() if k != "routing"}
    if model is not None:
        out["model"] = model
    try:
        return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:  # a lone surrogate escape ("\ud800") the client sent: written escaped, as it came
        return json.dumps(out, separators=(",", ":")).encode()


#: Most answers a request may count (``RouteRequest.n``'s bound).
MAX_ANSWERS = 128
#: Content part types of the Responses and Anthropic Messages APIs read as text (with the key holding it).
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
_IMAGE_PARTS = frozenset({"input_image", "image", "image_url"})
_FILE_PARTS = frozenset({"input_file", "document", "file"})
_AUDIO_PARTS = frozenset({"input_audio"})


def chat_request(body: JSONObject) -> JSONObject:
    """The request body as the chat request the decision reads (``pointsman.request.RouteRequest``):

    - Chat Completions: as it is;
    - Completions: ``prompt`` one user message; a list of prompts is a batch, answered (and billed)
      once per prompt, so its ``n`` answers per prompt (``best_of`` when larger: generated and billed,
      ``n`` of them returned) count as ``n`` x prompts answers (at most
      ``MAX_ANSWERS``), and its prompts are the message's text parts, one each (``with_completions_routing``
      marks it ``routing.batch``: each prompt is its own sequence); a prompt of token ids is read as its ids
      (``completions_prompts``), counted exactly by ``prompt_token_ids``; a list mixing the forms is refused
      (``RequestError``);
    - Responses (``input``): ``instructions`` a system message, ``input`` (a string, or message items
      with ``input_text`` / ``input_image`` / ``input_file`` / ``input_audio`` parts, and
      ``function_call`` / ``function_call_output`` items) the messages, ``max_output_tokens`` the cap; an
      ``item_reference`` (an item the provider stored) a message of its JSON marked ``type: item_reference``;
      a ``prompt`` object (a prompt template the provider stored, with or without ``input``) a user message of
      its id and version and its ``variables`` (strings, or text, image and file parts) marked ``type: prompt``;
      ``text.format`` (a structured output schema) the ``response_format``;
    - Anthropic Messages (``system`` beside ``messages``): the system prompt a system message, its
      ``image`` / ``document`` / ``tool_use`` / ``tool_result`` blocks read as image, file and text.

    So every prompt token is counted and every input kind reaches the capability filter."""
    if "messages" in body:
        if "system" not in body and not any(_foreign_parts(m) for m in _list(body["messages"])):
            return body
        messages: list[JSONValue] = []
        system = body.get("system")
        if system is not None:
            messages.append({"role": "system", "content": _content(system)})
        messages += [_message(m) for m in _list(body["messages"])]
        return {**{k: v for k, v in body.items() if k != "system"}, "messages": messages}
    if _is_responses(body):
        return _responses(body)
    if "prompt" not in body:
        return body
    texts = completions_prompts(body["prompt"])
    content: JSONValue = texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]
    out: JSONObject = {**body, "messages": [{"role": "user", "content": content}]}
    n = asked = body.get("n", 1)
    best_of = body.get("best_of")  # answers generated (and billed) server-side, n of them returned
    if _answers(best_of) and (_answers(n) or n is None) and best_of > (n or 1):
        n = best_of
    if (len(texts) > 1 or n != asked) and _answers(n):
        out["n"] = min(MAX_ANSWERS, n * len(texts))
    return out


def _is_responses(body: JSONObject) -> bool:
    """Whether ``body`` (no ``messages``) is a Responses API body: it has ``input``, or a ``prompt`` object (a stored
    prompt template; a Completions ``prompt`` is never an object)."""
    return "input" in body or isinstance(body.get("prompt"), dict)


def _answers(value: JSONValue) -> TypeGuard[int]:
    """Whether ``value`` is a number of answers (a JSON integer >= 1, not a boolean)."""
    return type(value) is int and value >= 1


def _token_ids(value: JSONValue) -> bool:
    """Whether ``value`` is a non-empty list of token ids (JSON integers, not booleans)."""
    return isinstance(value, list) and bool(value) and all(type(i) is int for i in value)


def completions_prompts(prompt: JSONValue) -> list[str]:
    """The prompts of a Completions ``prompt`` as texts: a string, a list of strings, a list of token
    ids (one prompt) or a list of token id lists (a batch), the four forms of the OpenAI and vLLM APIs.
    A prompt of token ids is written as its ids separated by spaces (the same ids, the same text: its
    prefix blocks stay its own); ``prompt_token_ids`` gives its exact token count.
    Raises ``RequestError`` (``param`` ``prompt``) for anything else: a list mixing the forms, an empty
    list, an empty prompt of ids, an id that is not an integer."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return [p for p in prompt if isinstance(p, str)]
    if _token_ids(prompt):
        return [" ".join(map(str, _list(prompt)))]
    if isinstance(prompt, list) and prompt and all(_token_ids(p) for p in prompt):
        return [" ".join(map(str, _list(p))) for p in prompt]
    raise RequestError("prompt must be a string, a list of strings, a list of token ids or a list of token id "
                       "lists (non-empty; the forms not mixed)", field="prompt")


def with_completions_routing(chat: JSONObject, body: JSONObject) -> JSONObject:
    """``chat`` (``chat_request(body)`` with its routing context) with what ``body``'s Completions ``prompt``
    tells: ``routing.batch`` for a list of prompts (``chat_request`` made them text parts), and
    ``routing.prompt_tokens`` the number of token ids it carries (``prompt_token_ids``) unless the routing
    context already has a count; ``chat`` itself otherwise (and for any other API's body)."""
    if "messages" in body or _is_responses(body) or "prompt" not in body:
        return chat
    ids = prompt_token_ids(body)
    given = chat.get("routing")
    routing: JSONObject = dict(given) if isinstance(given, dict) else {}
    if ids is not None and routing.get("prompt_tokens") is None:
        routing["prompt_tokens"] = ids
    messages = _list(chat.get("messages"))
    if messages and isinstance(messages[0], dict) and isinstance(messages[0].get("content"), list):
        routing["batch"] = True
    return {**chat, "routing": routing} if routing and (given is None or isinstance(given, dict)) else chat


def prompt_token_ids(body: JSONObject) -> int | None:
    """The number of token ids a Completions body's ``prompt`` carries (every prompt of a batch), which is
    its exact prompt token count for the model whose tokenizer made them; None when the prompt is text
    (or the body is no Completions body). Call after ``chat_request`` accepted the body."""
    if "messages" in body or _is_responses(body):
        return None
    prompt = body.get("prompt")
    if _token_ids(prompt):
        return len(_list(prompt))
    if isinstance(prompt, list) and prompt and all(_token_ids(p) for p in prompt):
        return sum(len(_list(p)) for p in prompt)
    return None


#: Chat Completions content part types (``pointsman.request.ContentPart``).
_CHAT_PARTS = frozenset({"text", "image_url", "image", "input_audio", "file", "refusal"})
#: Content block types of the other APIs that ``chat_request`` reads as parts (Responses, Anthropic Messages).
_OTHER_API_PARTS = (frozenset(_TEXT_PARTS) | _IMAGE_PARTS | _FILE_PARTS | _AUDIO_PARTS
                    | {"tool_use", "tool_result"}) - _CHAT_PARTS


def decided_body(body: JSONObject) -> JSONObject:
    """The body ``POST /v1/route`` and ``pointsman route --messages`` decide on: another API's request
    (a top-level ``system``, no ``messages``, or a block of the Responses or Anthropic APIs in a message)
    read as the endpoint picker reads it (``chat_request``, with its token ids counted and its batch marked:
    ``with_completions_routing``); a Chat Completions body as it is, so a part type no API has
    (``video``) is named by the request's validation. Raises ``RequestError`` as ``chat_request``."""
    if "system" in body or "messages" not in body or any(
            _part_type(p) in _OTHER_API_PARTS for m in _list(body["messages"]) if isinstance(m, dict)
            for p in _list(m.get("content"))):
        return with_completions_routing(chat_request(body), body)
    return body


def _part_type(part: JSONValue) -> str | None:
    """A content part's ``type`` when it is a string (a list or an object is no type), else None."""
    kind = part.get("type") if isinstance(part, dict) else None
    return kind if isinstance(kind, str) else None


def _foreign_parts(message: JSONValue) -> bool:
    """Whether a message has content blocks that are no Chat Completions part (Anthropic's, ...)."""
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(isinstance(p, dict) and _part_type(p) not in _CHAT_PARTS
                                             for p in content)


def _list(value: JSONValue) -> list[JSONValue]:
    return value if isinstance(value, list) else []


def _text(value: JSONValue) -> str:
    """The text of a string, a list of text blocks, or anything else (its JSON)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) and isinstance(b.get("text"), str) for b in value):
        return "\n".join(str(b["text"]) for b in value if isinstance(b, dict))
    return "" if value is None else json.dumps(value, ensure_ascii=False)


def _parts(block: JSONValue) -> list[JSONObject]:
    """One content block of any of the APIs as Chat Completions parts, keeping its ``cache_control``
    (Anthropic's prompt-cache breakpoint: what an explicit-cache target caches, ``has_cache_control``) on
    the last. A ``tool_result`` whose content is a list of blocks (a computer-use screenshot: an ``image``
    block, a ``document``) gives its blocks' parts, so an image is an image, not its base64 read as text."""
    content = block.get("content") if isinstance(block, dict) and block.get("type") == "tool_result" else None
    parts = [p for b in content for p in _parts(b)] if isinstance(content, list) else [_chat_part(block)]
    if isinstance(block, dict) and "cache_control" in block and parts:
        parts[-1] = {**parts[-1], "cache_control": block["cache_control"]}
    return parts


def _chat_part(block: JSONValue) -> JSONObject:
    if not isinstance(block, dict):
        return {"type": "text", "text": _text(block)}
    kind = block.get("type")
    if not isinstance(kind, str):
        return {"type": "text", "text": json.dumps(block, ensure_ascii=False)}
    if kind in _TEXT_PARTS:
        return {"type": "text", "text": _text(block.get(_TEXT_PARTS[kind]))}
    if kind in _IMAGE_PARTS:  # Responses' input_image: its URL and detail side by side
        ref = block.get("image_url") or block.get("source")
        return {"type": "image_url", "image_url": {"url": ref, "detail": block["detail"]}
                if isinstance(ref, str) and isinstance(block.get("detail"), str) else ref}
    if kind in _FILE_PARTS:  # the payload (Chat's file, Anthropic's source, Responses' file_data) for its pages
        return {"type": "file", "file": block.get("file") or block.get("source") or block}
    if kind in _AUDIO_PARTS:
        return {"type": "input_audio", "input_audio": block.get("input_audio")}
    if kind == "tool_use":
        return {"type": "text", "text": f"{block.get('name', '')}({json.dumps(block.get('input'), ensure_ascii=False)})"}
    if kind == "tool_result":
        return {"type": "text", "text": _text(block.get("content"))}
    return {"type": "text", "text": json.dumps(block, ensure_ascii=False)}  # counted as what it is


def _content(value: JSONValue) -> JSONValue:
    if not isinstance(value, list):
        return _text(value)
    parts: list[JSONValue] = [p for b in value for p in _parts(b)]
    return parts or ""  # (a tool result of no blocks)


def _message(item: JSONValue) -> JSONValue:
    if not isinstance(item, dict):
        return item
    if isinstance(item.get("content"), list):
        return {**item, "content": _content(item["content"])}
    return item


def _responses(body: JSONObject) -> JSONObject:
    """A Responses API body as a chat request (see ``chat_request``)."""
    messages: list[JSONValue] = []
    if body.get("instructions") is not None:
        messages.append({"role": "system", "content": _text(body["instructions"])})
    template = body.get("prompt")
    if isinstance(template, dict):  # a stored prompt template: its text is the provider's (RouteRequest.stored_state)
        variables = template.get("variables", {})
        name = template.get("id")
        if not isinstance(name, str) or not name.strip():
            raise RequestError("a stored prompt template (a Responses 'prompt' object) needs its 'id', a non-empty "
                               "string", field="prompt.id")
        if not isinstance(variables, dict):
            raise RequestError("a stored prompt template's 'variables' must be an object of names to values",
                               field="prompt.variables")
        values = list(variables.values())
        named = {k: v for k, v in template.items() if k != "variables"}
        parts: list[JSONValue] = [json.dumps(named, ensure_ascii=False)]
        parts += [v if isinstance(v, dict) else _text(v) for v in values]
        messages.append({"role": "user", "type": "prompt", "content": _content(parts)})
    items = body.get("input")
    for item in items if isinstance(items, list) else [] if items is None else [{"role": "user", "content": items}]:
        if not isinstance(item, dict):
            messages.append({"role": "user", "content": _text(item)})
            continue
        kind = item.get("type", "message")
        if kind == "message" or "role" in item:
            role = item.get("role")
            role = role if isinstance(role, str) and role in ("system", "developer", "user", "assistant") else "user"
            messages.append({"role": role, "content": _content(item.get("content"))})
        elif kind == "function_call":
            messages.append({"role": "assistant", "content": f"{item.get('name', '')}({_text(item.get('arguments'))})"})
        elif kind == "function_call_output":  # its output: a string, or input_text/input_image/input_file items
            messages.append({"role": "tool", "content": _content(item.get("output"))})
        elif kind == "computer_call_output":  # its output: a screenshot (computer_screenshot, an image)
            output = item.get("output")
            messages.append({"role": "tool", "content": [{"type": "image_url", "image_url": output.get("image_url")
                                                          if isinstance(output, dict) else None}]})
        elif kind == "item_reference":  # an item the provider stored: marked (RouteRequest.stored_state)
            messages.append({"role": "user", "content": json.dumps(item, ensure_ascii=False), "type": kind})
        else:  # reasoning, ...: counted as their JSON
            messages.append({"role": "user", "content": json.dumps(item, ensure_ascii=False)})
    out: JSONObject = {k: v for k, v in body.items() if k not in ("input", "instructions", "max_output_tokens", "prompt")}
    out["messages"] = messages or [{"role": "user", "content": ""}]
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    text = body.get("text")
    if isinstance(text, dict) and text.get("format") is not None:  # a structured output schema (frontier input)
        out["response_format"] = text["format"]
    return out


@dataclass(frozen=True)
class ResponseSummary:
    """What a response body said: ``usage`` in the upstream's shape (None when it reported none),
    the ``model`` that answered (None when unknown), ``complete`` (the JSON parsed, or the SSE
    stream reached its end marker, see the module) and ``streamed_tokens``, a lower bound of an SSE
    stream's output tokens (see the module; 0 for a JSON body)."""

    usage: JSONObject | None
    model: str | None
    complete: bool
    streamed_tokens: int = 0


def usage_of(obj: JSONValue) -> tuple[JSONObject | None, str | None]:
    """``(usage, model)`` of one response object or stream event (see the module for the shapes)."""
    if not isinstance(obj, dict):
        return None, None
    for wrapper in ("response", "message"):  # Responses API stream event, Anthropic message_start
        inner = obj.get(wrapper)
        if isinstance(inner, dict) and ("usage" in inner or "model" in inner):
            obj = inner
            break
    model = obj.get("model") or obj.get("modelVersion")
    u = obj.get("usage")
    if not isinstance(u, dict):
        u = obj.get("usageMetadata")
    return u if isinstance(u, dict) else None, model if isinstance(model, str) else None


class UsageReader:
    """Reads usage from a response body fed in chunks (see the module). ``sse``: the body is an
    event stream (``content-type: text/event-stream``); ``encoding``: its ``content-encoding``
    (``gzip``/``deflate`` decoded; another one leaves ``undecodable`` True and reads nothing)."""

    def __init__(self, sse: bool, limit_bytes: int, encoding: str = "") -> None:
        encoding = encoding.strip().lower()
        self.undecodable = encoding not in DECODED_ENCODINGS | IDENTITY_ENCODINGS
        # gzip, or HTTP's deflate (the zlib format, RFC 9110); wbits | 32 reads either header
        self._inflate = zlib.decompressobj(zlib.MAX_WBITS | 32) if encoding in DECODED_ENCODINGS else None
        self.sse = sse
        self.limit_bytes = limit_bytes
        self._buf = bytearray()
        self._over = False
        self.usage: JSONObject | None = None
        self.model: str | None = None
        self.done = False
        self.bytes_seen = 0
        self.streamed_tokens = 0

    def feed(self, chunk: bytes) -> None:
        """Take the next chunk of the body (as it came, encoded or not)."""
        self.bytes_seen += len(chunk)
        if self.undecodable:
            return
        if self._inflate is None:
            self._feed(chunk)
            return
        try:
            data = self._inflate.decompress(chunk, _DECODE_STEP_BYTES)
            while True:
                self._feed(data)
                if not self._inflate.unconsumed_tail:
                    break
                data = self._inflate.decompress(self._inflate.unconsumed_tail, _DECODE_STEP_BYTES)
        except zlib.error:  # not what its header says: nothing read from it is trusted
            self.undecodable, self._buf, self.usage = True, bytearray(), None

    def _feed(self, chunk: bytes) -> None:
        if self._over:
            if not (self.sse and b"\n" in chunk):
                return
            self._over = False  # resynchronise after the end of the long line: the lines after it are read
            chunk = chunk[chunk.index(b"\n") + 1:]
        self._buf += chunk
        if self.sse:
            if b"\n" in chunk:
                cut = self._buf.rindex(b"\n")
                lines, self._buf = bytes(self._buf[:cut]), self._buf[cut + 1:]
                for line in lines.split(b"\n"):
                    self._line(line)
        if len(self._buf) > self.limit_bytes:
            self._buf, self._over = bytearray(), True

    def _line(self, line: bytes) -> None:
        line = line.strip()
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        self.streamed_tokens += len(_STREAMED.findall(data))
        if b'"usage' not in data and b'"model' not in data and b'message_stop' not in data:
            return
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):  # (nested past the reader's depth: no usage read from it)
            return
        usage, model = usage_of(event)
        if usage is not None:
            self.usage = {**(self.usage or {}), **usage}
        if model is not None:
            self.model = model
        if isinstance(event, dict) and event.get("type") in ("response.completed", "response.incomplete",
                                                             "message_stop"):
            self.done = True

    def summary(self) -> ResponseSummary:
        """What the body said, once it has ended."""
        if self.undecodable:
            return ResponseSummary(None, None, False)
        if self.sse:
            if self._buf and not self._over:
                self._line(bytes(self._buf))
                self._buf = bytearray()
            return ResponseSummary(self.usage, self.model, self.done, self.streamed_tokens)
        if self._over or not self._buf:
            return ResponseSummary(None, None, False)
        try:
            obj = json.loads(bytes(self._buf))
        except (ValueError, RecursionError):
            return ResponseSummary(None, None, False)
        usage, model = usage_of(obj)
        return ResponseSummary(usage, model, True)
