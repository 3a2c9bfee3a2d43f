"""Block hashes computed the way vLLM (or SGLang) computes them, and the prompt token ids it hashes.

A request's block hashes here are the ones its engine publishes in ``BlockStored`` events
(``kv_events``), so the prefix index can match a prompt against what the engines report
holding. Followed: ``vllm==0.33.0:vllm/v1/core/kv_cache_utils.py`` (``hash_block_tokens``,
``get_request_block_hasher``, ``init_none_hash``, ``maybe_convert_block_hash``),
``vllm/utils/hashing.py`` (``sha256``, ``sha256_cbor``) and ``vllm/envs.py``, as summarised in the
research notes (``/work/notes/protocols.md`` §1.7); the same structure since vLLM 0.10.2.

**The chain.** Only *full* blocks of ``block_size`` tokens are hashed (vLLM's default 16,
``CacheConfig.DEFAULT_BLOCK_SIZE``; use the engine's ``block_size`` — ``hash_block_size`` on
hybrid models — from ``vllm:cache_config_info``). Block *i*'s hash is
``H((parent, tuple(block_i_token_ids), extra_keys))`` with ``parent`` the previous block's
hash, or ``NONE_HASH`` for the first block, and ``extra_keys`` None for plain text requests
(multimodal and prompt-embeds requests add keys this module does not model: their hashes will not
match, and the router falls back to its estimate). Modelled, as ``generate_block_hash_extra_keys``
builds them (``vllm/v1/core/kv_cache_utils.py``, read at vllm-project/vllm 001cabc): a LoRA
request's adapter name (``lora_request.lora_name``, the name the OpenAI server's ``model`` selects)
keys every block, and a request's ``cache_salt`` (vLLM ≥ 0.9) the block starting at token 0 only;
``extra_keys`` is the tuple ``(lora_name, cache_salt)`` of those present (None when neither is), so
an adapter's or a salt's blocks share no hash with another's. SGLang's pages are hashed without
either (its radix tree keeps them apart by an ``extra_key`` its events do not carry).

**H** (``prefix_caching_hash_algo``): ``sha256`` — SHA-256 of ``pickle.dumps(obj, protocol=5)``
(vLLM's ``pickle.HIGHEST_PROTOCOL``, 5 on every Python vLLM supports; the default since 0.10.2)
— or ``sha256_cbor`` — SHA-256 of ``cbor2.dumps(obj, canonical=True)`` (language-neutral). The
xxhash variants are not supported.

**The seed.** ``NONE_HASH = H(seed)`` with ``seed`` the engine's ``PYTHONHASHSEED`` string when
it sets one; without it vLLM ≥ 0.29 uses the fixed string ``"vllm-none-hash"`` for these two
algorithms (``seed=None`` here), while vLLM 0.10.2–0.28 draws a random seed per process —
then hashes can only be matched if every engine runs with a fixed ``PYTHONHASHSEED``.

**In events** a hash is the digest's last 8 bytes read big-endian as an unsigned u64
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, the default), or the raw 32 bytes when that
variable is 0 (``int_hashes=False``). ``EngineHasher.keys`` gives the u64 form either way:
the key ``kv_events.hash_key`` makes of either event form.

**SGLang** (``engine="sglang"``) hashes differently, so a vLLM hash never matches an SGLang event
(read in ``sgl-project/sglang:python/sglang/srt/mem_cache/radix_cache.py``, ``_record_store_event`` and
``compute_node_hash_values``, and ``hicache_storage.py``, ``get_hash_str`` and ``hash_str_to_int64``):
its radix cache publishes one ``BlockStored`` per page of ``--page-size`` tokens (default 1), and page
*i*'s digest is SHA-256 over page *i − 1*'s 32-byte digest (nothing for the first page: no seed) then
each token id as 4 little-endian unsigned bytes; the event carries the digest's **first** 8 bytes as a
signed 64-bit int (``kv_events`` normalises it to the same bits unsigned). No extra keys: a LoRA
adapter's pages hash as the base model's. Older SGLang releases published ``hash(tuple(page_tokens))``,
a per-page hash not chained to its prefix: not supported (``service/feeds.py`` reports such a feed as
not matching). With page size 1 every token is a block: 32,768 hashes at the default bound, so lower
``max_tokens`` or run SGLang with a larger page size.

**Bounded cost.** At most ``max_tokens`` leading tokens are hashed (default 32,768, i.e. 2,048
blocks of 16); blocks past the bound are not hashed, so a match is never longer than it.
Measured on this machine (best of several runs, one core): ``sha256`` ≈ 1.5 µs per block
(pickle + SHA-256: 46 µs for a 500-token prompt, 3.1 ms at the bound), ``sha256_cbor`` ≈ 4.7 µs
per block (cbor2's canonical mode: 100 µs for 500 tokens, 9.6 ms at the bound — lower
``max_tokens`` for such targets if decisions must stay within a few milliseconds).

**The prompt tokens** (``TargetTokenizer``): a vLLM chat endpoint renders the conversation
with the model's chat template the way Hugging Face ``transformers`` does
(``transformers==5.3.0:transformers/utils/chat_template_utils.py``: a jinja2
``ImmutableSandboxedEnvironment`` with ``trim_blocks``, ``lstrip_blocks`` and ``loopcontrols``;
a ``tojson`` filter that does not escape HTML; ``raise_exception`` and ``strftime_now``
globals; variables ``messages``, ``tools``, ``documents``, ``add_generation_prompt`` and the
tokenizer's special tokens ``bos_token``, ``eos_token``, …), then tokenises the rendered text
**without adding special tokens** — the template already wrote BOS — because
``ChatCompletionRequest.add_special_tokens`` defaults to False
(``vllm-project/vllm@ec3b890c14b00f6670515d9df8d503b5270e95ca:vllm/entrypoints/openai/protocol.py``)
and the chat handler passes it on to tokenisation
(``vllm-project/vllm@003fe5932dc9e1b331347894d3cbc5ddfe89e9eb:vllm/entrypoints/openai/serving_chat.py``,
``_preprocess_chat(..., add_special_tokens=request.add_special_tokens)``). A Completions request
(``prompt``) is hashed as vLLM's completions endpoint reads it: its text tokenised with the
tokenizer's special tokens and no template, or its token ids as they are. Messages are
prepared as vLLM's ``vllm/entrypoints/chat_utils.py`` does for templates that take string
content: a list of content parts becomes its text parts joined by ``"\\n"``, and an assistant
message's tool-call ``arguments`` (a JSON string on the wire) are parsed into an object
(``_postprocess_messages``). Without a chat template the message texts are concatenated
(``role\\ntext\\n`` per message) and tokenised with the tokenizer's own special tokens — an
**approximation**: block boundaries differ from the engine's, so such hashes match only
Pointsman's own records, never an engine's events. Rendering and tokenising are bounded too:
text beyond ``max_tokens × max_chars_per_token`` characters is cut before tokenising (the
token at the cut is dropped, since it may be split).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Final, Literal, TypeAlias, cast, get_args

import cbor2
import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from pointsman.errors import PointsmanError
from pointsman.json_types import JSONObject, JSONValue
from pointsman.request import RouteRequest, TextPart

HashAlgo: TypeAlias = Literal["sha256", "sha256_cbor"]
HASH_ALGOS: Final[tuple[str, ...]] = get_args(HashAlgo)
#: vLLM's default tokens per block (``CacheConfig.DEFAULT_BLOCK_SIZE``).
DEFAULT_BLOCK_SIZE: Final = 16
#: Leading prompt tokens hashed at most (module docstring, "Bounded cost").
DEFAULT_MAX_TOKENS: Final = 32_768
#: The seed vLLM ≥ 0.29 uses for sha256 / sha256_cbor when ``PYTHONHASHSEED`` is unset.
VLLM_DEFAULT_SEED: Final = "vllm-none-hash"
#: vLLM's ``pickle.HIGHEST_PROTOCOL`` on every Python it supports.
PICKLE_PROTOCOL: Final = 5
#: Characters of rendered text tokenised per token of ``max_tokens`` at most.
MAX_CHARS_PER_TOKEN: Final = 8

_MASK64: Final = (1 << 64) - 1


class TargetTokenizerError(PointsmanError, ValueError):
    """A target's tokenizer file or chat template cannot be loaded, or the template refused a conversation."""


def _hash_sha256(obj: object) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=PICKLE_PROTOCOL)).digest()


def _hash_sha256_cbor(obj: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


_HASH_FNS: Final = {"sha256": _hash_sha256, "sha256_cbor": _hash_sha256_cbor}


def event_hash(digest: bytes, int_hashes: bool = True) -> int | bytes:
    """A block digest as vLLM publishes it: the last 8 bytes big-endian as a u64, or the raw bytes."""
    return int.from_bytes(digest, "big") & _MASK64 if int_hashes else digest


@dataclass(frozen=True)
class EngineHasher:
    """vLLM's block hashes for one engine configuration (see the module docstring).

    ``algo``: ``prefix_caching_hash_algo``; ``block_size``: the engine's (hash) block size;
    ``seed``: its ``PYTHONHASHSEED`` (None: vLLM ≥ 0.29's fixed seed); ``int_hashes``:
    ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``; ``max_tokens``: leading tokens hashed at most;
    ``engine``: ``vllm``, or ``sglang`` (its page hashes: ``algo``, ``seed`` and ``int_hashes`` unused).
    Raises ValueError naming a bad field.
    """

    algo: HashAlgo = "sha256"
    block_size: int = DEFAULT_BLOCK_SIZE
    seed: str | None = None
    int_hashes: bool = True
    max_tokens: int = DEFAULT_MAX_TOKENS
    engine: Literal["vllm", "sglang"] = "vllm"

    def __post_init__(self) -> None:
        if self.engine not in ("vllm", "sglang"):
            raise ValueError(f"engine: must be vllm or sglang, got {self.engine!r}")
        if self.algo not in HASH_ALGOS:
            raise ValueError(f"algo: must be one of {', '.join(HASH_ALGOS)}, got {self.algo!r}")
        if type(self.block_size) is not int or self.block_size < 1:
            raise ValueError(f"block_size: must be an integer >= 1, got {self.block_size!r}")
        if type(self.max_tokens) is not int or self.max_tokens < 0:
            raise ValueError(f"max_tokens: must be an integer >= 0, got {self.max_tokens!r}")
        if self.seed is not None and not isinstance(self.seed, str):
            raise ValueError(f"seed: must be the PYTHONHASHSEED string or None, got {self.seed!r}")

    @classmethod
    def from_env(cls, algo: HashAlgo = "sha256", block_size: int = DEFAULT_BLOCK_SIZE, *,
                 env: Mapping[str, str] | None = None, max_tokens: int = DEFAULT_MAX_TOKENS) -> EngineHasher:
        """The hasher of an engine started with environment ``env`` (default: this process's):
        ``PYTHONHASHSEED`` and ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` (``"0"``/``"false"``: bytes)."""
        env = os.environ if env is None else env
        flag = env.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1").strip().lower()
        return cls(algo, block_size, env.get("PYTHONHASHSEED"), flag not in ("0", "false"), max_tokens)

    @cached_property
    def none_hash(self) -> bytes:
        """``NONE_HASH``: the parent of every chain's first block."""
        return _HASH_FNS[self.algo](VLLM_DEFAULT_SEED if self.seed is None else self.seed)

    def digests(self, token_ids: Sequence[int], cache_salt: str | None = None,
                lora_name: str | None = None) -> list[bytes]:
        """The raw digests of the full blocks among the first ``max_tokens`` of ``token_ids``
        (Python ints: a numpy integer pickles differently; non-list sequences are converted);
        ``cache_salt``: the request's vLLM prefix-cache salt (None or empty: unsalted); ``lora_name``: its LoRA
        adapter (None or empty: the base model); both unused for SGLang (module docstring)."""
        ids = token_ids if type(token_ids) is list else [int(t) for t in token_ids]
        bs = self.block_size
        n = min(len(ids), self.max_tokens) // bs * bs
        if self.engine == "sglang":
            return _sglang_digests(ids, n, bs)
        fn = _HASH_FNS[self.algo]
        parent = self.none_hash
        out: list[bytes] = []
        append = out.append
        later: tuple[str, ...] | None = (lora_name,) if lora_name else None
        extra = (*(later or ()), cache_salt) if cache_salt else later
        for start in range(0, n, bs):
            parent = fn((parent, tuple(ids[start:start + bs]), extra))
            extra = later
            append(parent)
        return out

    def block_hashes(self, token_ids: Sequence[int]) -> list[int | bytes]:
        """The hashes as the engine publishes them in events (``int_hashes``: u64 ints, else bytes;
        SGLang: signed 64-bit ints)."""
        if self.engine == "sglang":
            return [int.from_bytes(d[:8], "big", signed=True) for d in self.digests(token_ids)]
        if self.int_hashes:
            return [int.from_bytes(d, "big") & _MASK64 for d in self.digests(token_ids)]
        return list(self.digests(token_ids))

    def keys(self, token_ids: Sequence[int], cache_salt: str | None = None, lora_name: str | None = None) -> list[int]:
        """The u64 index keys (``kv_events.hash_key`` of either event form; SGLang's first 8 digest bytes);
        ``cache_salt`` and ``lora_name`` as in ``digests``."""
        if self.engine == "sglang":
            return [int.from_bytes(d[:8], "big") for d in self.digests(token_ids)]
        return [int.from_bytes(d, "big") & _MASK64 for d in self.digests(token_ids, cache_salt, lora_name)]


    def root_key(self, token_ids: Sequence[int], extra_keys: tuple[object, ...] | None = None) -> int:
        """The u64 index key of a chain's first block, ``token_ids``' first ``block_size`` tokens (Python ints), hashed
        with vLLM's ``extra_keys`` as given (``hashed_extra_keys`` of a ``BlockStored``'s: any adapter, salt,
        multimodal or prompt-embeds keys; None: none); SGLang's pages have none. Raises ValueError for fewer tokens."""
        ids = list(token_ids[:self.block_size])
        if len(ids) < self.block_size:
            raise ValueError(f"a block needs {self.block_size} tokens, got {len(ids)}")
        if self.engine == "sglang":
            return int.from_bytes(_sglang_digests(ids, len(ids), len(ids))[0][:8], "big")
        return int.from_bytes(_HASH_FNS[self.algo]((self.none_hash, tuple(ids), extra_keys)), "big") & _MASK64


def hashed_extra_keys(keys: object) -> tuple[object, ...] | None:
    """One block's extra keys from a ``BlockStored``'s ``extra_keys`` (msgpack arrays read as lists) as vLLM hashed
    them: arrays as tuples, at any depth (a multimodal key is ``(identifier, offset)``); None stays None. Raises
    ValueError for anything else (a map: not a form vLLM hashes)."""
    if keys is None:
        return None
    if type(keys) is not list:
        raise ValueError(f"extra keys must be an array or null, got {type(keys).__name__}")

    def hashed(x: object) -> object:
        if type(x) is list:
            return tuple(hashed(y) for y in x)
        if x is None or type(x) in (str, bytes, int, float, bool):
            return x
        raise ValueError(f"an extra key of type {type(x).__name__}")
    return tuple(hashed(x) for x in keys)


def _sglang_digests(ids: list[int], n: int, page: int) -> list[bytes]:
    """SGLang's chained page digests of ``ids[:n]`` (``n`` a multiple of ``page``; module docstring)."""
    out: list[bytes] = []
    prior = b""
    sha256 = hashlib.sha256
    for start in range(0, n, page):
        prior = sha256(prior + b"".join(t.to_bytes(4, "little") for t in ids[start:start + page])).digest()
        out.append(prior)
    return out


# -- chat templates


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}`` (transformers' assistant-mask tag): renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: object, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template as ``transformers.apply_chat_template`` does (module docstring).
    Raises ``TargetTokenizerError`` with the template's line on a syntax error."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise TargetTokenizerError(f"chat template line {e.lineno}: {e.message}") from e


def _token_text(value: object) -> str | None:
    """A special token in ``tokenizer_config.json``: a string or an AddedToken object ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return cast(str, value["content"])
    return None


_SPECIAL_TOKEN_NAMES: Final = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _template_from_config(config: Mapping[str, object], tools: bool) -> str | None:
    """``chat_template`` of a tokenizer config: a string, or named templates (``tool_use`` when
    tools are given and it exists, else ``default``), as transformers picks them."""
    value = config.get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get("tool_use") if tools and "tool_use" in named else named.get("default")
        return chosen if isinstance(chosen, str) else None
    raise TargetTokenizerError(f"chat_template must be a string or a list of named templates, got {type(value).__name__}")


def template_messages(request: RouteRequest) -> list[JSONObject]:
    """A route request's messages as vLLM hands them to a chat template (module docstring):
    text content as a string (parts joined by ``"\\n"``), ``name``, ``tool_call_id`` and
    ``tool_calls`` with parsed ``arguments``."""
    out: list[JSONObject] = []
    for m in request.messages:
        msg: JSONObject = {"role": m.role}
        content = m.content
        if isinstance(content, list):
            msg["content"] = "\n".join(p.text for p in content if isinstance(p, TextPart))
        else:
            msg["content"] = content
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            calls: list[JSONValue] = []
            for call in m.tool_calls:
                arguments: JSONValue = call.function.arguments
                try:
                    parsed = json.loads(call.function.arguments)
                    if isinstance(parsed, dict):
                        arguments = parsed
                except ValueError:
                    pass
                calls.append({"id": call.id, "type": call.type,
                              "function": {"name": call.function.name, "arguments": arguments}})
            msg["tool_calls"] = calls
        out.append(msg)
    return out


class TargetTokenizer:
    """The prompt token ids a target's vLLM chat endpoint would hash (module docstring).

    ``tokenizer``: a ``tokenizers.Tokenizer`` (padding and truncation are switched off);
    ``chat_template``: the template source (None: the concatenation approximation, see
    ``approximate``); ``special_tokens``: template variables such as ``bos_token`` /
    ``eos_token``; ``max_tokens``: leading token ids returned at most; ``tool_template``: the
    ``tool_use`` template of a config with named templates, used when tools are given.
    """

    def __init__(self, tokenizer: Tokenizer, chat_template: str | None = None, *,
                 special_tokens: Mapping[str, str] | None = None, max_tokens: int = DEFAULT_MAX_TOKENS,
                 tool_template: str | None = None) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {max_tokens}")
        self.tokenizer = tokenizer
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})
        self.max_tokens = max_tokens
        self._template = None if chat_template is None else compile_chat_template(chat_template)
        self._tool_template = None if tool_template is None else compile_chat_template(tool_template)

    @property
    def approximate(self) -> bool:
        """True without a chat template: token ids of the concatenated messages, not the engine's."""
        return self._template is None

    @classmethod
    def from_files(cls, tokenizer_json: str | Path, *, tokenizer_config: str | Path | None = None,
                   chat_template: str | None = None, chat_template_file: str | Path | None = None,
                   max_tokens: int = DEFAULT_MAX_TOKENS) -> TargetTokenizer:
        """Load ``tokenizer.json`` and the chat template: ``chat_template`` (source text) or
        ``chat_template_file`` (a ``.jinja`` file) if given, else ``tokenizer_config.json``'s
        ``chat_template``; special tokens from the config. Raises ``TargetTokenizerError``."""
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_json))
        except Exception as e:  # the Rust side raises a bare Exception
            raise TargetTokenizerError(f"{tokenizer_json}: not a tokenizers tokenizer.json ({e})") from e
        config: dict[str, object] = {}
        if tokenizer_config is not None:
            try:
                loaded = json.loads(Path(tokenizer_config).read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise TargetTokenizerError(f"{tokenizer_config}: cannot read the tokenizer config ({e})") from e
            if not isinstance(loaded, dict):
                raise TargetTokenizerError(f"{tokenizer_config}: the tokenizer config must be a JSON object")
            config = loaded
        source, tool_source = chat_template, None
        if source is None and chat_template_file is not None:
            try:
                source = Path(chat_template_file).read_text(encoding="utf-8")
            except OSError as e:
                raise TargetTokenizerError(f"{chat_template_file}: cannot read the chat template ({e})") from e
        if source is None:
            source = _template_from_config(config, tools=False)
            tool_source = _template_from_config(config, tools=True)
            if tool_source == source:
                tool_source = None
        special = {name: text for name in _SPECIAL_TOKEN_NAMES if (text := _token_text(config.get(name))) is not None}
        return cls(tokenizer, source, special_tokens=special, max_tokens=max_tokens, tool_template=tool_source)

    def render(self, messages: Sequence[Mapping[str, object]], *, tools: Sequence[Mapping[str, object]] | None = None,
               add_generation_prompt: bool = True) -> str:
        """The prompt text the engine builds from ``messages`` (OpenAI-style dicts, content a
        string). Without a template: ``role\\ntext\\n`` per message. Raises
        ``TargetTokenizerError`` when the template raises (e.g. roles that do not alternate)."""
        template = self._tool_template if tools and self._tool_template is not None else self._template
        if template is None:
            return "".join(f"{m.get('role', '')}\n{m.get('content') or ''}\n" for m in messages)
        try:
            return template.render(messages=[dict(m) for m in messages], tools=None if tools is None else list(tools),
                                   documents=None, add_generation_prompt=add_generation_prompt, **self.special_tokens)
        except jinja2.TemplateError as e:
            raise TargetTokenizerError(f"the chat template refused the conversation: {e}") from e

    def token_ids(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """The first ``max_tokens`` token ids of ``text`` (text past ``max_tokens ×
        MAX_CHARS_PER_TOKEN`` characters is cut first and the token at the cut dropped)."""
        return self._token_ids(text, add_special_tokens)[0]

    def _token_ids(self, text: str, add_special_tokens: bool) -> tuple[list[int], bool]:
        """(``token_ids``, whether they are all of ``text``'s)."""
        limit = self.max_tokens * MAX_CHARS_PER_TOKEN
        cut = len(text) > limit
        ids = cast(list[int], self.tokenizer.encode(text[:limit] if cut else text, add_special_tokens=add_special_tokens).ids)
        if cut and ids:
            ids.pop()
        return ids[:self.max_tokens], not cut and len(ids) <= self.max_tokens

    def prompt_token_ids(self, messages: Sequence[Mapping[str, object]], *,
                         tools: Sequence[Mapping[str, object]] | None = None, add_generation_prompt: bool = True) -> list[int]:
        """The leading prompt token ids (at most ``max_tokens``) the engine would hash for this
        chat request: the rendered template tokenised without adding special tokens; without a
        template, the approximation with the tokenizer's special tokens."""
        text = self.render(messages, tools=tools, add_generation_prompt=add_generation_prompt)
        return self.token_ids(text, add_special_tokens=self.approximate)

    def request_token_ids(self, request: RouteRequest) -> list[int]:
        """The leading prompt token ids (at most ``max_tokens``) the engine hashes for a route request: a chat request's
        ``prompt_token_ids`` (``template_messages``, its ``tools``); a Completions request's prompt as vLLM's
        completions endpoint reads it (``RouteRequest.completions_prompt``): its text tokenised with the tokenizer's
        special tokens (``CompletionRequest.add_special_tokens`` defaults to True) and no template, or its ids."""
        return self.request_tokens(request)[0]

    def request_tokens(self, request: RouteRequest) -> tuple[list[int], bool]:
        """(``request_token_ids``, whether they are the whole prompt: not cut at ``max_tokens``)."""
        raw = request.completions_prompt
        if isinstance(raw, list):
            return raw[:self.max_tokens], len(raw) <= self.max_tokens
        if raw is not None:
            return self._token_ids(raw, True)
        text = self.render(template_messages(request), tools=request.tools)
        return self._token_ids(text, self.approximate)
