"""vLLM's block hashes (the research notes' test vectors, and the stand-in engine's independent
implementation) and the prompt token ids of a chat request rendered through a chat template the
way transformers and vLLM do. (The renderings of LLAMA3_STYLE were also compared once with
transformers 5.3.0's own ``render_jinja_template``: identical. Importing transformers takes
~15 s, so that comparison is not part of the suite.)"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from pointsman.policy.signals.engine_hashes import (
    DEFAULT_MAX_TOKENS,
    EngineHasher,
    TargetTokenizer,
    TargetTokenizerError,
    compile_chat_template,
    event_hash,
    template_messages,
)
from pointsman.policy.signals.kv_events import hash_key
from pointsman.request import parse_route_request


def _load_standin():
    if "standin_engine" in sys.modules:
        return sys.modules["standin_engine"]
    path = Path(__file__).resolve().parents[1] / "fixtures" / "standin_engine.py"
    spec = importlib.util.spec_from_file_location("standin_engine", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["standin_engine"] = module
    spec.loader.exec_module(module)
    return module


se = _load_standin()

# /work/notes/protocols.md §1.7: vLLM >= 0.29 default seed, tokens 1..16 then 17..32, no extra keys
VECTORS = {
    "sha256": ("066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198",
               "7b255da405e1d722823892e4fef187b4d8ac78215d7f0dd2137bb037547f4caf",
               "8e717becdc2054b7a3223b7b844f462c0db0ac86287b752b16d077ad0843c577",
               1403909460543360175, 1643945449041937783),
    "sha256_cbor": ("9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0",
                    "cd7c51bc5a8fc8643f383a2b9e01522fba7473c669e9270c7b0bf7bf7fd01682",
                    "2533ea50426b36e9e4d68296cac6bce8cf602e46957d0fe40b368b33d87bf3bf",
                    8866452693264111234, 807986237951177663),
}


@pytest.mark.parametrize("algo", sorted(VECTORS))
def test_notes_test_vectors(algo):
    none_hash, b1, b2, e1, e2 = VECTORS[algo]
    hasher = EngineHasher(algo)
    tokens = list(range(1, 33))
    assert hasher.none_hash.hex() == none_hash
    assert [d.hex() for d in hasher.digests(tokens)] == [b1, b2]
    assert hasher.block_hashes(tokens) == [e1, e2]
    assert hasher.keys(tokens) == [e1, e2]
    raw = EngineHasher(algo, int_hashes=False)
    assert raw.block_hashes(tokens) == [bytes.fromhex(b1), bytes.fromhex(b2)]
    assert [hash_key(h) for h in raw.block_hashes(tokens)] == [e1, e2] == raw.keys(tokens)
    assert event_hash(bytes.fromhex(b1)) == e1 and event_hash(bytes.fromhex(b1), False) == bytes.fromhex(b1)


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("block_size, seed", [(16, None), (16, "0"), (32, "12345"), (1, None), (7, "seed")])
def test_matches_the_standin_engines_independent_implementation(algo, block_size, seed):
    rng = random.Random(f"{algo}{block_size}{seed}")
    tokens = [rng.randrange(0, 200_000) for _ in range(block_size * 5 + 3)]
    ours = EngineHasher(algo, block_size, seed)
    theirs = se.vllm_block_digests(tokens, algo=algo, block_size=block_size, seed=seed)
    assert ours.digests(tokens) == theirs and len(theirs) == len(tokens) // block_size
    cache = se.StandinKVCache(algo=algo, block_size=block_size, seed=seed)
    assert ours.block_hashes(tokens) == cache.hashes(tokens)
    assert EngineHasher(algo, block_size, seed, int_hashes=False).block_hashes(tokens) == \
        se.StandinKVCache(algo=algo, block_size=block_size, seed=seed, int_hashes=False).hashes(tokens)


def test_seed_only_full_blocks_and_the_token_bound():
    tokens = list(range(1, 33))
    assert EngineHasher(seed="0").digests(tokens) != EngineHasher().digests(tokens)
    assert EngineHasher.from_env(env={"PYTHONHASHSEED": "0"}).digests(tokens) == EngineHasher(seed="0").digests(tokens)
    assert EngineHasher.from_env(env={"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"}).int_hashes is False
    assert EngineHasher.from_env(env={}) == EngineHasher()
    assert len(EngineHasher().digests(list(range(47)))) == 2  # the partial third block is not hashed
    assert EngineHasher().digests(list(range(15))) == []
    bounded = EngineHasher(max_tokens=40)
    assert bounded.digests(list(range(1000))) == EngineHasher().digests(list(range(32)))
    assert EngineHasher().max_tokens == DEFAULT_MAX_TOKENS == 32_768
    assert len(EngineHasher().digests(list(range(40_000)))) == 2048
    # a chain is a prefix property: a longer prompt starts with the shorter one's hashes
    assert EngineHasher().keys(list(range(64)))[:2] == EngineHasher().keys(list(range(32)))


def test_non_list_token_ids_hash_as_python_ints():
    class Int(int):  # e.g. numpy integers pickle differently from int
        pass

    tokens = list(range(1, 33))
    assert EngineHasher().digests(tuple(Int(t) for t in tokens)) == EngineHasher().digests(tokens)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"algo": "xxhash"}, "algo: must be one of sha256, sha256_cbor"),
    ({"block_size": 0}, "block_size: must be an integer >= 1"),
    ({"max_tokens": -1}, "max_tokens: must be an integer >= 0"),
    ({"seed": 5}, "seed: must be the PYTHONHASHSEED string"),
])
def test_bad_hasher_settings(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        EngineHasher(**kwargs)


# -- chat templates and prompt token ids

BOS, EOS = "<|begin_of_text|>", "<|eot_id|>"
SPECIALS = [BOS, "<|start_header_id|>", "<|end_header_id|>", EOS]

# A small Llama-3-style template (written for this test).
LLAMA3_STYLE = (
    "{{- bos_token }}\n"
    "{%- if tools %}\n"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nTools: ' + tools | tojson + '<|eot_id|>' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message['role'] == 'assistant' and message.tool_calls %}\n"
    "        {%- set args = message.tool_calls[0].function.arguments %}\n"
    "        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\ncall ' + message.tool_calls[0].function.name"
    " + ' city=' + args.city + '<|eot_id|>' }}\n"
    "    {%- else %}\n"
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)
CONVERSATION = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  Hi there  "}]
EXPECTED = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n")


def _tokenizer_json(path: Path, *, truncate: bool = False) -> Path:
    """A tiny word-level tokenizer with Llama-3's special tokens and a post-processor that adds
    BOS (as Llama 3's does): tokenising a rendered template with special tokens would double it."""
    words = ["[UNK]", "system", "user", "assistant", "you", "are", "terse", ".", "hi", "there", "call", "city", "=",
             "paris", "get_weather", ":", "tools", "[", "]", "{", "}", '"', ",", "name"]
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.add_special_tokens(SPECIALS)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, bos_id)])
    if truncate:  # a tokenizer.json that pads/truncates (the packaged MiniLM one does): switched off on load
        tok.enable_truncation(max_length=4)
        tok.enable_padding(length=6)
    out = path / "tokenizer.json"
    tok.save(str(out))
    return out


@pytest.fixture
def llama_files(tmp_path):
    config = {"chat_template": LLAMA3_STYLE, "bos_token": {"content": BOS, "lstrip": False}, "eos_token": EOS,
              "model_max_length": 131072}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return _tokenizer_json(tmp_path, truncate=True), tmp_path / "tokenizer_config.json"


def test_llama3_style_template_renders_the_expected_prompt(llama_files):
    tj, cfg = llama_files
    target = TargetTokenizer.from_files(tj, tokenizer_config=cfg)
    assert target.special_tokens == {"bos_token": BOS, "eos_token": EOS}
    assert not target.approximate
    assert target.render(CONVERSATION) == EXPECTED
    assert target.render(CONVERSATION, add_generation_prompt=False) == EXPECTED.rsplit("<|start_header_id|>", 1)[0]


def test_prompt_ids_are_not_given_a_second_bos(llama_files):
    tj, cfg = llama_files
    target = TargetTokenizer.from_files(tj, tokenizer_config=cfg)
    ids = target.prompt_token_ids(CONVERSATION)
    tok = target.tokenizer
    bos = tok.token_to_id(BOS)
    assert ids.count(bos) == 1 and ids[0] == bos
    assert ids == tok.encode(EXPECTED, add_special_tokens=False).ids
    assert len(ids) > 6  # the file's truncation/padding were switched off
    words = [tok.id_to_token(i) for i in ids]
    assert words[:5] == [BOS, "<|start_header_id|>", "system", "<|end_header_id|>", "you"]
    # these ids hash as the engine's would
    assert EngineHasher(block_size=4).keys(ids) == se.StandinKVCache(block_size=4).hashes(ids)


def test_route_request_messages_and_tools_as_vllm_passes_them(llama_files):
    tj, cfg = llama_files
    target = TargetTokenizer.from_files(tj, tokenizer_config=cfg)
    request = parse_route_request({
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}},
                                         {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "paris"}'}}]},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather"}}],
    })
    messages = template_messages(request)
    assert messages[0] == {"role": "user", "content": "hi\nthere"}
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "paris"}
    text = target.render(messages, tools=request.tools)
    assert text.startswith(BOS + '<|start_header_id|>system<|end_header_id|>\n\nTools: [{"type": "function", ')
    assert "call get_weather city=paris<|eot_id|>" in text and "<|end_header_id|>\n\nhi\nthere<|eot_id|>" in text
    assert target.request_token_ids(request) == target.token_ids(text)


def test_transformers_environment_features():
    def render(source: str, **variables: object) -> str:
        return compile_chat_template(source).render(**variables)

    # trim_blocks + lstrip_blocks
    assert render("{% for m in messages %}\n  {{ m.role }}: {{ m.content }}\n{% endfor %}\n",
                  messages=[{"role": "a", "content": "1"}, {"role": "b", "content": "2"}]) == "  a: 1\n  b: 2\n"
    # tojson without HTML escaping or ASCII escaping; indent
    assert render("{{ x | tojson }}", x={"k": "<é>"}) == '{"k": "<é>"}'
    assert render("{{ x | tojson(indent=2) }}", x=[1]) == "[\n  1\n]"
    # loopcontrols
    assert render("{% for i in [1, 2, 3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}") == "1"
    # strftime_now and the generation tag
    assert len(render("{{ strftime_now('%Y') }}")) == 4
    assert render("{% generation %}answer{% endgeneration %}") == "answer"
    # raise_exception refuses a conversation
    target = TargetTokenizer(Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")),
                             "{% if messages[0].role != 'user' %}{{ raise_exception('must start with user') }}{% endif %}")
    with pytest.raises(TargetTokenizerError, match="refused the conversation: must start with user"):
        target.render([{"role": "assistant", "content": "x"}])
    # the sandbox is immutable
    with pytest.raises(TargetTokenizerError):
        TargetTokenizer(target.tokenizer, "{{ messages.append(1) }}").render([])
    with pytest.raises(TargetTokenizerError, match="chat template line 1"):
        compile_chat_template("{% for %}")


def test_named_templates_and_template_file(tmp_path):
    tj = _tokenizer_json(tmp_path)
    cfg = tmp_path / "tokenizer_config.json"
    cfg.write_text(json.dumps({"chat_template": [{"name": "default", "template": "D{{ messages | length }}"},
                                                 {"name": "tool_use", "template": "T{{ tools | length }}"}]}))
    target = TargetTokenizer.from_files(tj, tokenizer_config=cfg)
    assert target.render(CONVERSATION) == "D2"
    assert target.render(CONVERSATION, tools=[{"type": "function"}]) == "T1"
    jinja = tmp_path / "chat_template.jinja"
    jinja.write_text("F{{ bos_token }}")
    assert TargetTokenizer.from_files(tj, chat_template_file=jinja).render(CONVERSATION) == "F"  # no config: no bos_token
    assert TargetTokenizer.from_files(tj, chat_template="S").render(CONVERSATION) == "S"


def test_without_a_template_the_messages_are_concatenated(tmp_path):
    target = TargetTokenizer.from_files(_tokenizer_json(tmp_path))
    assert target.approximate
    assert target.render(CONVERSATION) == "system\nYou are terse.\nuser\n  Hi there  \n"
    ids = target.prompt_token_ids(CONVERSATION)
    assert ids[0] == target.tokenizer.token_to_id(BOS)  # the tokenizer's own special tokens, here


def test_token_ids_are_bounded(tmp_path):
    target = TargetTokenizer.from_files(_tokenizer_json(tmp_path), chat_template="{{ messages[0].content }}",
                                        max_tokens=10)
    long = [{"role": "user", "content": "hi there " * 1000}]
    ids = target.prompt_token_ids(long)
    assert len(ids) == 10 and ids == target.tokenizer.encode("hi there " * 5, add_special_tokens=False).ids
    assert len(target.prompt_token_ids([{"role": "user", "content": "hi " * 40}])) == 10  # under the char cut too


def test_unreadable_files(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(TargetTokenizerError, match="not a tokenizers tokenizer.json"):
        TargetTokenizer.from_files(bad)
    tj = _tokenizer_json(tmp_path)
    cfg = tmp_path / "c.json"
    cfg.write_text("[1]")
    with pytest.raises(TargetTokenizerError, match="must be a JSON object"):
        TargetTokenizer.from_files(tj, tokenizer_config=cfg)
    with pytest.raises(TargetTokenizerError, match="cannot read the chat template"):
        TargetTokenizer.from_files(tj, chat_template_file=tmp_path / "missing.jinja")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), max_size=80), st.sampled_from([1, 2, 16, 32]))
def test_sglang_page_hashes_match_the_standin_engine(ids, page):
    """``engine="sglang"``: SGLang's chained SHA-256 page hashes (the stand-in's, written apart), as published
    (signed) and as index keys (the same 64 bits unsigned), never a vLLM hash of the same tokens."""
    sg = EngineHasher(block_size=page, engine="sglang")
    published = se.sglang_page_hashes(ids, page_size=page)
    assert sg.block_hashes(ids) == published
    assert sg.keys(ids) == [hash_key(h) for h in published]
    assert not set(sg.keys(ids)) & set(EngineHasher(block_size=page).keys(ids))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 200_000), max_size=70), st.sampled_from(["sha256", "sha256_cbor"]),
       st.sampled_from([1, 16]), st.one_of(st.none(), st.text(max_size=12)), st.one_of(st.none(), st.text(max_size=12)))
def test_a_cache_salt_and_a_lora_adapter_hash_as_vllm_keys_them(ids, algo, block_size, salt, lora):
    """vLLM's LoRA adapter name keys every block and its ``cache_salt`` the first one (the stand-in's implementation,
    written apart): a salted or adapter prompt shares no block hash with the same prompt under another salt or
    adapter, or with neither; an empty salt is no salt, an empty name no adapter."""
    ours = EngineHasher(algo, block_size)
    assert ours.digests(ids, salt, lora) == se.vllm_block_digests(ids, algo=algo, block_size=block_size,
                                                                  cache_salt=salt, lora_name=lora)
    keys = set(ours.keys(ids, salt, lora))
    if salt or lora:
        assert not keys & set(ours.keys(ids))
        assert not keys & set(ours.keys(ids, (salt or "") + "x", lora))
        assert not keys & set(ours.keys(ids, salt, (lora or "") + "x"))
    else:
        assert ours.keys(ids, salt, lora) == ours.keys(ids)
