"""Request features: what the policy and the estimator know about a request
before it runs, computed at a cost bounded independently of prompt length.

``extract_features(request, tokenizer=None) -> RequestFeatures``; ``request`` is a
``RouteRequest`` or its ``RequestView`` (the engine passes the view it built, so message
texts are extracted once per decision).

Bounded cost: the encoder sees at most ``QUERY_WINDOW_CHARS`` of the last user
message (head and tail), and token counting tokenizes at most
``COUNT_SAMPLE_CHARS`` of the conversation (head, tail and 8 slices of the middle) and
extrapolates by the measured characters-per-token ratio; ``prompt_tokens_upper`` bounds the
count from above for the context-window filter (``token_bounds.py``: whitespace and ``[UNK]``
spans the targets' BPE tokenizers count, and a byte scan of the whole text). A gateway that knows the exact count passes
``routing.prompt_tokens`` and that wins, unless it is implausibly low (``_plausible``: over
``MAX_CHARS_PER_SUPPLIED_TOKEN`` characters per token, under a token per message, or under
``MIN_SUPPLIED_PER_UNIT`` of the text's class units); then the prompt is counted here.

Long words: WordPiece (BERT's, the MiniLM tokenizer) turns any word longer than
``max_input_chars_per_word`` (100) into one ``[UNK]``, so 600 KB of hex or DNA letters
would count as a handful of tokens and slip past the context-window filter and the cost
estimate. The count adds ``ceil(chars / CHARS_PER_TOKEN) - 1`` tokens for every such
``[UNK]`` (about one token per 4 characters, what BPE tokenizers of the targets give such
runs or more conservative). Ordinary prompts have no word that long and their count is
unchanged; the check costs a scan of the ids for ``[UNK]`` (~20 µs per 16k characters).

Tokenize once: ``tokenized_features(request, tokenizer)`` also returns the token ids of
``query_text`` (what ``tokenizer.encode(query_text, add_special_tokens=False).ids`` gives),
cut out of the counting pass instead of tokenizing the query window a second time. That
is exact for tokenizers whose tokens never cross whitespace and whose normalizer works
character by character (BERT's: ``BertNormalizer`` + ``BertPreTokenizer`` + ``WordPiece``,
the MiniLM tokenizer): the window's ids are the ids of the words inside it, and a word the
window cuts is tokenized alone from its part inside (a few characters).
"""

from __future__ import annotations

import functools
import json
import math
import re
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING

from pointsman.estimator.billed_tokens import WEIGHT_VECTOR, byte_class_estimate, byte_class_vector
from pointsman.estimator.token_bounds import (
    class_units,
    class_units_utf8,
    extrapolated_upper,
    piece_upper,
    sample_pieces,
    unk_id,
)
from pointsman.estimator.wordpiece import UnkOffsets, word_piece, word_piece_ids
from pointsman.request import RequestView, RouteRequest, TextPart
from pointsman.session_texts import SESSION_TEXTS

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Encoding, Tokenizer

#: Characters of the last user message the encoder sees (head 3/4 + tail 1/4).
QUERY_WINDOW_CHARS = 2048
#: Earlier user turns the estimator reads besides the last one (most recent first), and the
#: characters of each it reads (head 3/4 + tail 1/4): the conversation's cost is bounded.
CONTEXT_TURNS = 4
CONTEXT_WINDOW_CHARS = 512
#: A last user turn shorter than this (characters), after an earlier user turn, is a short follow-up
#: ("yes", "go on", "thanks, do it"): it is at least as hard as the turn it continues
#: (``RequestFeatures.continues``).
SHORT_TURN_CHARS = 64
#: Characters of the conversation tokenized to count tokens (head half + tail half).
COUNT_SAMPLE_CHARS = 16384
#: Chat-format overhead per message in tokens (role markers), as in OpenAI's counting guide.
TOKENS_PER_MESSAGE = 4
#: Fallback characters per token when no tokenizer is available (English text, BPE);
#: also the count of a word too long for WordPiece.
CHARS_PER_TOKEN = 4.0
#: Tokens of one image input in the count and in the safe-side bound: OpenAI's high detail gives a
#: 1024x1024 image 85 + 4 x 170 = 765 tokens and at most 85 + 8 x 170 = 1,445; Anthropic's about
#: width x height / 750, at most ~1,600; Gemini 258. Images are not seen, so the count takes the common
#: case and the bound the largest. The cost estimate and the context-window filter replace them by the target's
#: rule at the image's size (``policy/media_tokens.py``: gpt-4o-mini bills up to 48,169 tokens an image).
IMAGE_TOKENS = 765
IMAGE_TOKENS_UPPER = 1600
#: Most characters per token a gateway's ``routing.prompt_tokens`` may imply before Pointsman counts the
#: prompt itself: tokenizers in use average 3-5 characters of text per token, and only runs of
#: whitespace or repeated characters reach 16. A supplied count below ``prompt_chars / 16`` is taken for a
#: mistake (a count of the last turn, of a truncated copy, or of another request): Pointsman counts the
#: prompt and bounds it itself, as when no count is supplied, and ``prompt_tokens_exact`` is False.
MAX_CHARS_PER_SUPPLIED_TOKEN = 16
#: Least share of the prompt's ``token_bounds.class_units`` (runs of letters and digits, punctuation,
#: non-ASCII characters: about one per word or symbol) a supplied count may be: BPE tokenizers give
#: 0.7-1.3 tokens per unit on prose and code, so half of them is a count of part of the prompt.
MIN_SUPPLIED_PER_UNIT = 0.5
#: Prompts of a batch whose tokens are bounded by counting (the longest in bytes); the others are bounded by
#: their bytes (``longest_prompt_upper``).
BATCH_COUNTED_PROMPTS = 4
#: A run of over 100 characters with no ASCII whitespace: the only place a word longer than
#: WordPiece's ``max_input_chars_per_word`` (100 for BERT's) can be (a cheap pre-check).
_LONG_RUN = re.compile(r"[^ \t\n\r]{101,}")


@dataclass(frozen=True)
class RequestFeatures:
    """Cheap facts about one request.

    ``prompt_tokens``: prompt length in tokens (exact when the gateway supplied it,
    ``prompt_tokens_exact``; otherwise counted on a bounded sample and extrapolated, the tool
    definitions' JSON included and ``IMAGE_TOKENS`` per image).
    ``billed_prompt_tokens``: the count that prices the request (``request.prompt_tokens``, the cost estimate,
    the budget hold): ``billed_tokens``' estimate of the targets' BPE count, on the safe side, >= ``prompt_tokens``
    (which stays the difficulty estimator's feature); the exact count when supplied; for the readings
    ``continues`` and ``alone`` (the estimator's only) ``prompt_tokens``; 0 when not computed.
    ``prompt_tokens_upper``: a safe-side upper bound of it (``token_bounds``; the exact count
    when supplied), what the context-window filter compares; 0 when not computed (then the count
    is the bound).
    ``longest_prompt_tokens_upper``: for a batch (``routing.batch``: a Completions prompt list, each prompt
    its own sequence), a safe-side upper bound of its longest prompt's tokens (``longest_prompt_upper``),
    which the context-window filter compares instead; 0 for a request of one sequence.
    ``n_low_detail_images``: image parts asking ``detail: low`` (of ``n_images``).
    ``turns``: number of user messages. ``query_text``: the bounded window of the
    last user message that the encoder embeds (at most ``QUERY_WINDOW_CHARS`` chars).
    ``query_chars``: full length of the last user message in characters.
    ``context_text``: bounded windows (``CONTEXT_WINDOW_CHARS`` each) of up to ``CONTEXT_TURNS``
    earlier user turns, most recent first, joined by newlines ("" for a single-turn request):
    what a short turn ("yes", "go on", a tool result after it) continues.
    ``context_chars``: full length of those earlier user turns in characters.
    ``continues``: for a short follow-up (a last user turn under ``SHORT_TURN_CHARS`` characters
    after an earlier user turn), the features of the conversation as it stood at the turn it
    continues (messages up to and including it, a supplied token count dropped); None otherwise.
    ``alone``: with ``continues``, the features of the follow-up read alone: a one-turn request of
    the system and developer messages, the tools and the last user message. The difficulty
    estimator takes the larger ``p_hard`` of these two readings (``DifficultyEstimator.estimate``).
    """

    prompt_chars: int
    prompt_tokens: int
    prompt_tokens_exact: bool
    turns: int
    n_messages: int
    system_chars: int
    query_chars: int
    query_text: str
    has_tools: bool
    has_images: bool
    n_images: int
    n_tool_calls: int
    max_output_tokens: int | None
    billed_prompt_tokens: int = 0
    n_low_detail_images: int = 0
    prompt_tokens_upper: int = 0
    longest_prompt_tokens_upper: int = 0
    context_text: str = ""
    context_chars: int = 0
    continues: RequestFeatures | None = None
    alone: RequestFeatures | None = None

    @property
    def priced_prompt_tokens(self) -> int:
        """The prompt tokens the money reads (``request.prompt_tokens``, the cost estimate, the budget hold, the
        dispatch record, the decision's count): ``billed_prompt_tokens``, or ``prompt_tokens`` where that was not
        computed (0: features made outside ``extract_features``)."""
        return max(self.prompt_tokens, self.billed_prompt_tokens)


def bounded_window(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` chars, else its first 3/4·limit and last 1/4·limit chars."""
    if len(text) <= limit:
        return text
    head = (limit * 3) // 4
    return text[:head] + "\n" + text[len(text) - (limit - head - 1) :]


def count_tokens(text: str, tokenizer: Tokenizer | None) -> int:
    """Tokens in ``text``: exact up to ``COUNT_SAMPLE_CHARS`` chars, extrapolated beyond.

    Without a tokenizer, ``ceil(chars / CHARS_PER_TOKEN)``. The tokenizer must have
    padding and truncation disabled. Cost is O(COUNT_SAMPLE_CHARS), not O(len(text)).
    """
    return _count(text, tokenizer)[0]


def count_tokens_upper(text: str, tokenizer: Tokenizer | None) -> int:
    """A safe-side upper bound of the tokens in ``text`` (``token_bounds``; >= ``count_tokens``).
    Cost O(COUNT_SAMPLE_CHARS) tokenized plus a byte scan of ``text``."""
    return _count(text, tokenizer)[1]


def _encode(tokenizer: Tokenizer, texts: list[str], offsets: bool) -> list[Encoding]:
    """``texts`` encoded without special tokens; ``offsets``: with character offsets and word ids
    (tokenizers' ``encode_batch_fast`` skips offset tracking, ~15% less time)."""
    fast = None if offsets else getattr(tokenizer, "encode_batch_fast", None)  # tokenizers >= 0.20
    if fast is not None:  # one call per text: a batch goes to a thread pool (measured slower on one core)
        return [fast([text], add_special_tokens=False)[0] for text in texts]
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def _count(text: str, tokenizer: Tokenizer | None, offsets: bool = False) -> tuple[int, int, Encoding | None]:
    """(``count_tokens``, ``count_tokens_upper``, the encoding of ``text`` when it was tokenized
    whole: None when it was sampled, empty, or counted without a tokenizer). ``offsets``: the
    encoding must carry character offsets and word ids; otherwise only its ids are meaningful.
    Past ``COUNT_SAMPLE_CHARS`` the count tokenizes the head, the tail and slices of the middle
    (``token_bounds.sample_pieces``) and extrapolates by their characters per token."""
    n, upper, encoding, _ = _count_ids(text, tokenizer, offsets)
    return n, upper, encoding


def _count_ids(text: str, tokenizer: Tokenizer | None, offsets: bool = False,
               units: Callable[[], int | None] | None = None) -> tuple[int, int, Encoding | None, list[int] | None]:
    """``_count`` and the ids of ``text`` when it was tokenized whole (else None). ``units``: gives
    ``class_units(text)`` (or None) when the caller can count it cheaper (``_joined_units``: from the texts
    encoded once, and what the session's last turn counted)."""
    if not text:
        return 0, 0, None, None
    if tokenizer is None:
        n = math.ceil(len(text) / CHARS_PER_TOKEN)
        return n, max(n, _text_units(text, units)), None, None
    pieces = sample_pieces(text, COUNT_SAMPLE_CHARS)
    whole = len(pieces) == 1
    fast = None if offsets and whole else word_piece(tokenizer)
    encodings: list[Encoding | None]
    if fast is not None:  # the same ids as the library's, without its offsets (``wordpiece``)
        ids_of, encodings = [fast.ids(piece) for piece in pieces], [None] * len(pieces)
    else:
        encoded = _encode(tokenizer, pieces, offsets and whole)
        ids_of, encodings = [encoding.ids for encoding in encoded], list(encoded)
    n, bounds = 0, []
    for piece, ids, encoding in zip(pieces, ids_of, encodings):
        with_offsets: Encoding | UnkOffsets | None = encoding if offsets and whole else None
        if fast is not None and fast.unk in ids:  # the [UNK] spans without a second library pass
            with_offsets = fast.unk_offsets(piece)
        n += len(ids) + long_word_tokens(piece, ids, with_offsets, tokenizer)
        bounds.append(piece_upper(piece, ids, with_offsets, tokenizer))
    if whole:
        return n, max(n, sum(a + b for a, b, _ in bounds)), encodings[0], ids_of[0]
    n = max(1, round(n * len(text) / sum(len(p) for p in pieces)))
    return n, max(n, extrapolated_upper(text, pieces, bounds, _text_units(text, units))), None, None


def _text_units(text: str, units: Callable[[], int | None] | None) -> int:
    """``class_units(text)``, from ``units()`` when it gives the count."""
    got = None if units is None else units()
    return class_units(text) if got is None else got


def long_word_tokens(text: str, ids: list[int], encoding: Encoding | UnkOffsets | None, tokenizer: Tokenizer) -> int:
    """Tokens to add to ``len(ids)`` (the ids of ``text``, no special tokens) for the words a
    WordPiece tokenizer turned into a single ``[UNK]`` because they exceed its
    ``max_input_chars_per_word``: ``ceil(chars / CHARS_PER_TOKEN) - 1`` for each (chars from
    the offsets). 0 for other tokenizers, and when ``ids`` has no ``[UNK]`` or ``text`` no run
    of over 100 non-whitespace characters (the cheap checks, in that order). ``encoding``:
    ``text`` encoded with offsets (or its ``[UNK]`` tokens alone, ``wordpiece.UnkOffsets``), or None
    to encode it again here when needed. Cost
    O(len(text))."""
    word_piece_model = _word_piece_model(tokenizer)
    if word_piece_model is None:
        return 0
    unk, limit = word_piece_model
    if unk not in ids or _LONG_RUN.search(text) is None:
        return 0
    if encoding is None:
        encoding = tokenizer.encode(text, add_special_tokens=False)
    extra = 0
    for token_id, (a, b) in zip(encoding.ids, encoding.offsets):
        if token_id == unk and b - a > limit:
            extra += math.ceil((b - a) / CHARS_PER_TOKEN) - 1
    return extra


@functools.lru_cache(maxsize=8)
def _facts(tokenizer: object) -> tuple[tuple[int | None, int] | None, bool]:
    """Per tokenizer object, read once (the tokenizers objects' properties cost a few µs each, and a
    tokenizer's pipeline is set when it is loaded): (``[UNK]`` id, WordPiece's
    ``max_input_chars_per_word``), None for a tokenizer that is not WordPiece; and
    ``splits_words_locally``."""
    from tokenizers import models

    model = getattr(tokenizer, "model", None)
    word_piece_model = (unk_id(tokenizer), int(model.max_input_chars_per_word)) \
        if isinstance(model, models.WordPiece) else None
    return word_piece_model, _splits_words_locally(tokenizer)


def _word_piece_model(tokenizer: object) -> tuple[int | None, int] | None:
    """(``[UNK]`` id, ``max_input_chars_per_word``) of a WordPiece tokenizer, else None (cached)."""
    return _facts(tokenizer)[0]


def splits_words_locally(tokenizer: object) -> bool:
    """True when ``tokenizer``'s tokens never cross whitespace or punctuation and its
    normalizer maps characters one by one, so the tokens of a span of text are those of its
    words (BERT's ``BertNormalizer`` + ``BertPreTokenizer`` + ``WordPiece``); then
    ``span_token_ids`` is exact. Cached per tokenizer object (a tokenizer's pipeline is set
    when it is loaded: ``encoders.load_tokenizer``)."""
    return False if tokenizer is None else _facts(tokenizer)[1]


def _splits_words_locally(tokenizer: object) -> bool:
    """True when ``tokenizer``'s tokens never cross whitespace or punctuation and its
    normalizer maps characters one by one, so the tokens of a span of text are those of its
    words (BERT's ``BertNormalizer`` + ``BertPreTokenizer`` + ``WordPiece``); then
    ``span_token_ids`` is exact."""
    from tokenizers import models, normalizers, pre_tokenizers

    try:
        return (isinstance(getattr(tokenizer, "normalizer"), normalizers.BertNormalizer)  # noqa: B009 - any object
                and isinstance(getattr(tokenizer, "pre_tokenizer"), pre_tokenizers.BertPreTokenizer)  # noqa: B009
                and isinstance(getattr(tokenizer, "model"), models.WordPiece))  # noqa: B009
    except AttributeError:  # not a tokenizers.Tokenizer
        return False


_start = itemgetter(0)


def span_token_ids(encoding: Encoding, text: str, a: int, b: int, tokenizer: Tokenizer) -> list[int]:
    """The ids of ``text[a:b]`` tokenized alone (no special tokens), cut out of ``encoding``
    (``tokenizer.encode(text, add_special_tokens=False)``): the ids of the words inside the
    span, and for a word the span cuts, the ids of its part inside, tokenized alone. Exact
    when ``splits_words_locally(tokenizer)``; ``a``/``b`` are character offsets."""
    ids, offsets, words = encoding.ids, encoding.offsets, encoding.word_ids
    i = bisect_left(offsets, a, key=_start)  # first token starting at or after a
    j = bisect_left(offsets, b, key=_start)  # first token starting at or after b
    out: list[int] = []
    if i > 0:  # the word of the token before a: does it reach into the span?
        w, last = words[i - 1], i - 1
        while last + 1 < len(words) and words[last + 1] == w:
            last += 1
        end = offsets[last][1]
        if end > a:
            if end >= b:  # the span lies inside one word
                return list(tokenizer.encode(text[a:b], add_special_tokens=False).ids)
            out += tokenizer.encode(text[a:end], add_special_tokens=False).ids
            i = last + 1
    if j > i:  # the word of the last token starting before b: does it reach past b?
        w, first, last = words[j - 1], j - 1, j - 1
        while last + 1 < len(words) and words[last + 1] == w:
            last += 1
        if offsets[last][1] > b:
            while first - 1 >= i and words[first - 1] == w:
                first -= 1
            out += ids[i:first]
            out += tokenizer.encode(text[offsets[first][0]:b], add_special_tokens=False).ids
            return out
    out += ids[i:j]
    return out


def window_token_ids(encoding: Encoding, text: str, start: int, end: int, tokenizer: Tokenizer) -> list[int]:
    """The ids of ``bounded_window(text[start:end], QUERY_WINDOW_CHARS)`` tokenized alone (no
    special tokens), cut out of ``encoding`` of ``text`` (see ``span_token_ids``; the window's
    two parts are joined by a newline, which has no token)."""
    n = end - start
    if n <= QUERY_WINDOW_CHARS:
        if start == 0 and end == len(text):
            return list(encoding.ids)
        return span_token_ids(encoding, text, start, end, tokenizer)
    head = (QUERY_WINDOW_CHARS * 3) // 4
    tail = QUERY_WINDOW_CHARS - head - 1
    return (span_token_ids(encoding, text, start, start + head, tokenizer)
            + span_token_ids(encoding, text, end - tail, end, tokenizer))


def extract_features(request: RouteRequest | RequestView, tokenizer: Tokenizer | None = None) -> RequestFeatures:
    """Compute ``RequestFeatures`` for a validated request (or its ``RequestView``).

    ``tokenizer``: a ``tokenizers.Tokenizer`` used for counting (the estimator's);
    ``None`` falls back to a characters-per-token estimate.
    """
    return _extract(request, tokenizer, False)[0]


def tokenized_features(request: RouteRequest | RequestView, tokenizer: Tokenizer | None,
                       with_ids: bool = True) -> tuple[RequestFeatures, list[int] | None]:
    """``extract_features`` and the token ids of its ``query_text``: exactly
    ``tokenizer.encode(query_text, add_special_tokens=False).ids``, cut out of the counting
    pass (see the module) when ``with_ids``, the conversation was tokenized whole and
    ``splits_words_locally(tokenizer)``; else None (the caller tokenizes the window itself)."""
    return _extract(request, tokenizer, with_ids)


def _earlier_user_turns(request: RouteRequest, texts: tuple[str, ...], k: int | None) -> list[str]:
    """Texts of up to ``CONTEXT_TURNS`` user messages before message ``k``, most recent first;
    stops after that many (a long conversation costs no more)."""
    out: list[str] = []
    i = -1 if k is None else k - 1
    while i >= 0 and len(out) < CONTEXT_TURNS:
        if request.messages[i].role == "user" and texts[i]:
            out.append(texts[i])
        i -= 1
    return out


def _plausible(supplied: int, texts: tuple[str, ...], prompt_chars: int, n_messages: int) -> bool:
    """Whether a gateway's ``routing.prompt_tokens`` can be the prompt's count: at least one token per
    message plus ``prompt_chars / MAX_CHARS_PER_SUPPLIED_TOKEN``, and at least ``MIN_SUPPLIED_PER_UNIT`` of
    the text's ``class_units`` (its pre-tokens: a count of the last turn of a long conversation falls
    below it). O(prompt characters) in byte operations, no tokenizer."""
    if supplied < n_messages + prompt_chars / MAX_CHARS_PER_SUPPLIED_TOKEN:
        return False
    return supplied >= MIN_SUPPLIED_PER_UNIT * sum(class_units(t) for t in texts)


def _extract(source: RouteRequest | RequestView, tokenizer: Tokenizer | None,
             want_ids: bool, readings: bool = True) -> tuple[RequestFeatures, list[int] | None]:
    """The features (and with ``want_ids`` the query window's token ids); ``readings``: also a short
    follow-up's two readings (``continues``, ``alone``), which are read without theirs: one level."""
    view = source if isinstance(source, RequestView) else RequestView.of(source)
    request, texts = view.request, view.texts
    prompt_chars = sum(map(len, texts))
    k = next((i for i in range(len(texts) - 1, -1, -1) if request.messages[i].role == "user" and texts[i]), None)
    if k is None:  # no user text (e.g. an image-only turn): fall back to the last message with text
        k = next((i for i in range(len(texts) - 1, -1, -1) if texts[i]), None)
    query = "" if k is None else texts[k]
    exact = request.routing.prompt_tokens
    n_images = sum(m.n_images() for m in request.messages)
    tools_text = json.dumps(request.tools, separators=(",", ":"), ensure_ascii=False) if request.tools else ""
    if exact is not None and not _plausible(exact, texts + (tools_text,), prompt_chars + len(tools_text),
                                            len(request.messages)):
        exact = None  # implausibly low (``_plausible``): count the prompt here
    query_ids: list[int] | None = None
    if exact is not None:
        prompt_tokens = prompt_upper = billed = exact
    else:
        # tool definitions are prompt text for every provider: counted after the messages (so the
        # messages' offsets hold); images by IMAGE_TOKENS / IMAGE_TOKENS_UPPER each
        joined = "\n".join(texts) + ("\n" + tools_text if tools_text else "")
        want_ids = want_ids and k is not None and splits_words_locally(tokenizer)
        # the conversation only sampled for counting: the caller tokenizes the window
        fast = word_piece_ids(tokenizer) if want_ids and len(joined) <= COUNT_SAMPLE_CHARS else None
        # offsets are needed to cut the window out, unless the window is the whole conversation,
        # or the window is tokenized alone at the fast tokenizer's cost (``wordpiece``)
        whole = len(query) == len(joined) and len(query) <= QUERY_WINDOW_CHARS
        n, upper, encoding, joined_ids = _count_ids(joined, tokenizer, offsets=want_ids and fast is None and not whole
                                                    and len(joined) <= COUNT_SAMPLE_CHARS,
                                                    units=_joined_units(view, tools_text, readings))
        if fast is not None:  # the window is the conversation itself: its ids are the count's
            query_ids = list(joined_ids) if whole and joined_ids is not None else \
                fast(bounded_window(query, QUERY_WINDOW_CHARS))
        prompt_tokens = n + TOKENS_PER_MESSAGE * len(request.messages) + IMAGE_TOKENS * n_images
        # the money's count (``billed_tokens``; a reading is the estimator's alone: its count)
        billed = prompt_tokens if not readings else IMAGE_TOKENS * n_images + max(
            n + TOKENS_PER_MESSAGE * len(request.messages), math.ceil(_billed_estimate(view, joined)))
        prompt_upper = upper + TOKENS_PER_MESSAGE * len(request.messages) + IMAGE_TOKENS_UPPER * n_images
        if want_ids and fast is None and encoding is not None and k is not None:
            if whole:
                query_ids = list(encoding.ids)
            else:
                start = sum(len(t) for t in texts[:k]) + k  # each earlier text and its newline
                query_ids = window_token_ids(encoding, joined, start, start + len(query), tokenizer)
    batch = [p.text for p in request.batch_prompts() if isinstance(p, TextPart)]
    longest = min(prompt_upper, longest_prompt_upper(batch, tokenizer)) if batch else 0
    context = _earlier_user_turns(request, texts, k)
    follow_up = readings and k is not None and len(query) < SHORT_TURN_CHARS
    continues = _continued(view, k, tokenizer) if follow_up and k is not None else None
    alone = _alone(view, k, tokenizer) if continues is not None and k is not None else None
    # the messages' roles and tool calls in one pass (a decision's path: one generator each cost more)
    turns = system_chars = n_tool_calls = 0
    tool_turn = False
    for m, t in zip(request.messages, texts):
        role = m.role
        if role == "user":
            turns += 1
        elif role in ("system", "developer"):
            system_chars += len(t)
        elif role in ("tool", "function"):
            tool_turn = True
        if m.tool_calls:
            n_tool_calls += len(m.tool_calls)
        if m.function_call is not None:
            n_tool_calls += 1
    return RequestFeatures(
        prompt_chars=prompt_chars,
        prompt_tokens=prompt_tokens,
        billed_prompt_tokens=billed,
        prompt_tokens_upper=prompt_upper,
        longest_prompt_tokens_upper=longest,
        prompt_tokens_exact=exact is not None,
        turns=turns,
        n_messages=len(request.messages),
        system_chars=system_chars,
        query_chars=len(query),
        query_text=bounded_window(query, QUERY_WINDOW_CHARS),
        has_tools=bool(request.tools) or n_tool_calls > 0 or tool_turn,
        has_images=n_images > 0,
        n_images=n_images,
        n_low_detail_images=sum(m.n_images("low") for m in request.messages) if n_images else 0,
        n_tool_calls=n_tool_calls,
        max_output_tokens=request.max_output_tokens,
        context_text="\n".join(bounded_window(t, CONTEXT_WINDOW_CHARS) for t in context),
        context_chars=sum(map(len, context)),
        continues=continues,
        alone=alone,
    ), query_ids


def longest_prompt_upper(prompts: list[str], tokenizer: Tokenizer | None) -> int:
    """A safe-side upper bound of the tokens of the longest of a batch's ``prompts`` (each its own sequence),
    chat overhead (``TOKENS_PER_MESSAGE``) included: ``count_tokens_upper`` of the ``BATCH_COUNTED_PROMPTS``
    longest in UTF-8 bytes, and for the others their bytes (no tokenizer makes more tokens than a text has
    bytes: a byte-level BPE token is at least one byte). Cost: that many counts (each bounded) and a byte
    count of every prompt. ``prompts`` must not be empty."""
    sized = sorted(((len(p.encode("utf-8")), p) for p in prompts), key=itemgetter(0), reverse=True)
    rest = sized[BATCH_COUNTED_PROMPTS][0] if len(sized) > BATCH_COUNTED_PROMPTS else 0
    return TOKENS_PER_MESSAGE + max(rest, *(count_tokens_upper(p, tokenizer) for _, p in sized[:BATCH_COUNTED_PROMPTS]))


def _billed_estimate(view: RequestView, joined: str) -> float:
    """``billed_tokens.byte_class_estimate`` of the conversation as ``view.conversation_utf8`` holds it (a role and
    two newlines per message: ~4 tokens, about the chat format's ``TOKENS_PER_MESSAGE``), its counts kept under the
    view's session (``session_texts.SESSION_TEXTS``: a next turn counts what it adds); for a text with a lone
    surrogate, of ``joined`` plus ``TOKENS_PER_MESSAGE`` per message."""
    try:
        data = view.conversation_utf8
    except UnicodeEncodeError:
        return byte_class_estimate(joined) + TOKENS_PER_MESSAGE * len(view.texts)
    return float(WEIGHT_VECTOR @ SESSION_TEXTS.billed(data, view.session_key, byte_class_vector))


def _joined_units(view: RequestView, tools_text: str, kept: bool) -> Callable[[], int | None]:
    """A function giving ``class_units`` of ``"\\n".join(view.texts)`` (and ``"\\n" + tools_text`` when any):
    that of the view's ``conversation_utf8`` (from its texts encoded once per decision; counted by
    ``session_texts.SESSION_TEXTS`` under the view's session when ``kept``, so a next turn counts what it adds;
    a cut of the conversation is counted whole) less its framing: the tools' segment, per message its role (one
    run of letters) and a newline, and one newline more (``role\\ntext\\n`` per message against ``n - 1`` joining
    newlines; a newline ends every run, so counts add across it). None for a text
    with a lone surrogate (``utf8`` refuses it; the count then encodes the text with ``surrogatepass``)."""
    def units() -> int | None:
        try:
            data = view.conversation_utf8
        except UnicodeEncodeError:
            return None
        whole = SESSION_TEXTS.units(data, view.session_key, class_units_utf8) if kept else class_units_utf8(data)
        out = whole - class_units_utf8(view.tools_utf8) - 2 * len(view.texts) - 1
        if tools_text:
            out += 1 + class_units(tools_text)
        return out
    return units


def _cut_view(view: RequestView, request: RouteRequest, keep: list[int]) -> RequestView:
    """A view of ``request`` (``view``'s request cut to the messages at ``keep``) sharing ``view``'s texts
    and, when encoded already, their UTF-8."""
    cut = RequestView(request, tuple(view.texts[i] for i in keep), view.api_key_id)
    if "utf8" in view.__dict__:  # functools.cached_property's slot
        cut.__dict__["utf8"] = tuple(view.utf8[i] for i in keep)
    return cut


def _continued(view: RequestView, k: int, tokenizer: Tokenizer | None) -> RequestFeatures | None:
    """The features of ``view``'s conversation cut after the turn a short follow-up at message ``k``
    continues: the latest of the ``CONTEXT_TURNS`` earlier user turns with text that has at least
    ``SHORT_TURN_CHARS`` characters, else the earliest of them (None when there is no earlier user
    turn): a short turn inherits from what the conversation's recent turns asked, not from a request
    further back. The cut request keeps the system prompt, tools and earlier turns, and drops a
    supplied token count (it counts the whole). The cut is read without readings of its own (a
    chain of short turns is one cut, not a recursion): one extra count at most."""
    request, texts = view.request, view.texts
    users = [i for i in range(k) if request.messages[i].role == "user" and texts[i]][-CONTEXT_TURNS:]
    if not users:
        return None
    j = next((i for i in reversed(users) if len(texts[i]) >= SHORT_TURN_CHARS), users[0])
    routing = request.routing.model_copy(update={"prompt_tokens": None})
    cut = request.model_copy(update={"messages": request.messages[: j + 1], "routing": routing})
    return _extract(_cut_view(view, cut, list(range(j + 1))), tokenizer, False, readings=False)[0]


def _alone(view: RequestView, k: int, tokenizer: Tokenizer | None) -> RequestFeatures:
    """The features of message ``k`` (a short follow-up) read alone: the request cut to its system
    and developer messages and message ``k`` (tools kept, a supplied token count dropped)."""
    request = view.request
    keep = [i for i in range(k) if request.messages[i].role in ("system", "developer")] + [k]
    routing = request.routing.model_copy(update={"prompt_tokens": None})
    cut = request.model_copy(update={"messages": [request.messages[i] for i in keep], "routing": routing})
    return _extract(_cut_view(view, cut, keep), tokenizer, False, readings=False)[0]
