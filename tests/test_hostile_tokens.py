"""Hostile tokenizer files and careless calls: bounded chat templates, templates found where transformers finds them,
tokenizer.json bounds, lone surrogates, decode(None) and malformed chat messages (reliability review B3, B8, B15,
B16, T6, T8)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import llmwalk as lw
import oracle
from llmwalk import convert_hf, tokens
from llmwalk.tokens import HFTokenizer, TokenizerMeta, UnsafeChatTemplateError

HI = [{"role": "user", "content": "hi"}]

# The review's templates and their relatives: each would hang or allocate gigabytes without the limits.
HOSTILE = ["{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}",
           "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
           "{{ 'x' * 10000000000 }}", "{{ ('x'*100000)*100000 }}",
           "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
           "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
           "{{ ([('x'*100000)] * 10000) | join }}", "{{ ','.join([('x'*100000)] * 10000) }}",
           "{{ range(100000)|map('center', 100000)|list|length }}", "{{ 'x'.center(10000000000) }}",
           "{{ '%0*d' % (1000000000, 1) }}", "{{ '{:>1000000000}'.format('x') }}",
           "{{ 'x'|indent(1000000000, true) }}", "{{ 2 ** 100000000000 }}",
           "{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(60) }}",
           "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
           "{% set big = 'x'*5000000 %}{% macro m() %}{% for i in range(1000) %}{{ big }}{% endfor %}{% endmacro %}"
           "{{ m() }}",
           "{% set big = 'x'*5000000 %}{% set s %}{% for i in range(1000) %}{{ big }}{% endfor %}{% endset %}{{ s }}",
           "{{ ('x'*1000).replace('x', 'y'*100000) }}", "{{ ([[1]*1000000]*1000)|sum(start=[]) }}",
           "{{ (range(10000)|list)|tojson(indent=1000000) }}", "{{ ('x\\n' * 1000)|indent(' ' * 1000000) }}",
           "{{ '%-1000000000s' % 'x' }}", "{{ '{:x>1000000000}'.format('x') }}"]

CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))
from llmwalk import tokens
class Tok(tokens.Tokenizer):
    name, vocab_size = "hostile", 1
for template in json.loads(sys.stdin.read()):
    tok = Tok()
    tok.chat_template = template
    try:
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
        print(json.dumps(["returned", ""]), flush=True)
    except BaseException as e:
        print(json.dumps([type(e).__name__, str(e)]), flush=True)
"""


def test_hostile_templates_end_at_once_with_a_limit_error():
    """Each template in a child under a 2 GiB address-space cap: a limit error, never a MemoryError or a hang."""
    root = Path(tokens.__file__).parent.parent
    run = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(HOSTILE), capture_output=True, text=True,
                         timeout=120, cwd=root, env={"PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"})
    results = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(results) == len(HOSTILE), run.stderr[-2000:]
    for template, (kind, message) in zip(HOSTILE, results):
        assert kind == "UnsafeChatTemplateError", (template, kind, message)
        assert "went past a limit" in message and "without chat=True" in message, (template, message)


class Tiny(tokens.Tokenizer):
    name, vocab_size, chat_template_source = "tiny", 1, "/models/tiny/chat_template.jinja"


def tiny(template: str) -> Tiny:
    tok = Tiny()
    tok.chat_template = template
    return tok


def loops(outer: int) -> str:
    return f"{{% for i in range({outer}) %}}{{% for j in range(1000) %}}{{% endfor %}}{{% endfor %}}"


def test_nested_loops_count_their_product_and_the_error_names_the_file_and_limit():
    # n outer and 1000 n inner iterations, plus 2 + 2 n calls (each range(), and the counter each loop goes through)
    assert tiny(loops(997)).apply_chat_template(HI) == ""            # 1003 * 997 + 2 = 999,993 steps: allowed
    with pytest.raises(UnsafeChatTemplateError, match=r"tiny's chat template \(from /models/tiny/chat_template"
                                                      r"\.jinja\) went past a limit \(more than 1,000,000 loop"):
        tiny(loops(998)).apply_chat_template(HI)                     # 1,000,996


def test_output_and_built_characters_are_bounded_relative_to_the_messages():
    big = [{"role": "user", "content": "x" * 1_000_000}]
    out = tiny("{% for m in messages %}{{ '<' + m.content + '>' }}{% endfor %}").apply_chat_template(big)
    assert len(out) == 1_000_002                                     # a long message is fine...
    with pytest.raises(UnsafeChatTemplateError, match="builds more than 10,000,040 characters"):
        tiny("{% for i in range(2) %}{{ 'x' * 5000000 }}{% endfor %}").apply_chat_template(HI)   # ...10M of output not


def test_a_slow_template_stops_at_the_time_limit(monkeypatch):
    ticks = iter(range(10**6))
    monkeypatch.setattr(tokens, "_clock", lambda: next(ticks))       # one "second" per look at the clock
    with pytest.raises(UnsafeChatTemplateError, match="rendering took more than 5 s"):
        tiny("{% for i in range(100) %}{{ i }}{% endfor %}").apply_chat_template(HI)


# ---------------------------------------------------------------- templates where transformers finds them (B8)

OTHER = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"


@pytest.fixture(scope="module")
def hf_tok():
    return oracle.hf_tokenizer("smollm2-135m")


def saved(hf_tok, path: Path, template) -> Path:
    """A tokenizer directory written by transformers' own save_pretrained, with `template` as its chat template."""
    import copy
    tok = copy.deepcopy(hf_tok)
    tok.chat_template = template
    tok.save_pretrained(str(path))
    return path


def ours(path: Path, smollm2):
    return convert_hf._hf_dir_tokenizer(path, "saved", smollm2.config)


CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "法国的首都是什么"}]


def test_chat_template_jinja_written_by_transformers_renders_as_transformers(smollm2, hf_tok, tmp_path):
    path = saved(hf_tok, tmp_path, hf_tok.chat_template)
    assert (path / "chat_template.jinja").exists()
    assert "chat_template" not in json.loads((path / "tokenizer_config.json").read_text())
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(str(path)).apply_chat_template(CONVERSATION, tokenize=False,
                                                                        add_generation_prompt=True)
    assert ours(path, smollm2).apply_chat_template(CONVERSATION) == ref


def test_named_templates_use_the_default_as_transformers(smollm2, hf_tok, tmp_path):
    path = saved(hf_tok, tmp_path, {"default": OTHER, "tool_use": "{{ 'tools' }}"})
    assert (path / "additional_chat_templates" / "tool_use.jinja").exists()
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(str(path)).apply_chat_template(CONVERSATION, tokenize=False)
    assert ours(path, smollm2).apply_chat_template(CONVERSATION) == ref
    assert ref == "[system] Be brief.\n[user] 法国的首都是什么\n"                 # the default, not tool_use


def test_only_named_templates_and_no_default_names_them_and_the_fix(smollm2, hf_tok, tmp_path):
    """Not "a base model": the folder has templates, none of them the default transformers and llmwalk render."""
    path = saved(hf_tok, tmp_path, {"tool_use": "{{ 'tools' }}", "rag": "{{ 'rag' }}"})
    assert not (path / "chat_template.jinja").exists()
    with pytest.raises(ValueError, match=r"no default chat template: .*additional_chat_templates holds only named "
                                         r"ones \(rag, tool_use\).*copy the one you want to chat_template.jinja"):
        ours(path, smollm2).apply_chat_template(CONVERSATION)


def test_legacy_list_in_tokenizer_config_renders_as_transformers(smollm2, hf_tok, tmp_path):
    path = saved(hf_tok, tmp_path, None)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "{{ 'tools' }}"},
                               {"name": "default", "template": OTHER}]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(str(path)).apply_chat_template(CONVERSATION, tokenize=False)
    tok = ours(path, smollm2)
    assert tok.apply_chat_template(CONVERSATION) == ref
    assert tok.chat_template_source == str(path / "tokenizer_config.json")


def test_a_hostile_template_file_is_named_in_the_error(smollm2, hf_tok, tmp_path):
    path = saved(hf_tok, tmp_path, HOSTILE[1])
    with pytest.raises(UnsafeChatTemplateError, match=f"from {path / 'chat_template.jinja'}.*loop iterations"):
        ours(path, smollm2).encode("hi", chat=True)


# ---------------------------------------------------------------- tokenizer.json bounds (B15)

def test_an_oversized_tokenizer_json_is_refused_before_parsing(tmp_path):
    with open(tmp_path / "tokenizer.json", "wb") as f:                  # sparse: costs no disk
        f.truncate(tokens.MAX_TOKENIZER_JSON_BYTES + 1)
    with pytest.raises(ValueError, match=r"tokenizer\.json is 64,000,001 bytes, more than the 64,000,000"):
        HFTokenizer(tmp_path / "tokenizer.json", TokenizerMeta(name="big"))


def test_tokenizer_json_is_parsed_once(smollm2, monkeypatch, tmp_path):
    """The decoder's type comes from the parsed tokenizer, not from a second json.loads of the whole file."""
    smollm2.tokenizer.backend.save(str(tmp_path / "tokenizer.json"))

    def no_json(*a, **k):
        raise AssertionError("tokenizer.json parsed a second time")
    monkeypatch.setattr(tokens.json, "loads", no_json)
    tok = HFTokenizer(tmp_path / "tokenizer.json", smollm2.tokenizer.meta)
    assert tok.decode(tok.encode("naïve café")) == "naïve café"      # byte-level decoding still found


def test_vocab_larger_than_the_model_is_refused(smollm2):
    tok = smollm2.tokenizer
    tokens.check_vocab(tok, 49152, "ok")
    tokens.check_vocab(tok, 49216, "padded rows are fine")
    with pytest.raises(ValueError, match=r"/m: the tokenizer has 49,152 tokens but the model's vocab_size is 1,000"):
        tokens.check_vocab(tok, 1000, "/m")


# ---------------------------------------------------------------- careless calls (B16, T6, T8)

@pytest.mark.parametrize("text", ["\ud800", "abc\udfffdef", "hi \ud800"])
def test_lone_surrogate_is_a_clear_value_error_everywhere(smollm2, text):
    for tok in (smollm2.tokenizer, lw.gpt2_tokenizer()):
        for call in (lambda: tok.encode(text), lambda: tok.text_ids(text)):
            with pytest.raises(ValueError, match="contains a lone surrogate.*remove it"):
                call()
    with pytest.raises(ValueError, match="lone surrogate"):
        smollm2.tokenizer.encode(text, chat=True)
    with pytest.raises(ValueError, match=r"messages\[0\]\['content'\] contains a lone surrogate"):
        smollm2.tokenizer.apply_chat_template([{"role": "user", "content": text}])


def test_decode_of_none_names_the_fix(smollm2):
    for call in (smollm2.tokenizer.decode, smollm2.tokenizer.pieces):
        with pytest.raises(TypeError, match="token ids are a list of ints, got NoneType: pass the ids encode"):
            call(None)


@pytest.mark.parametrize("messages,error,match", [
    (None, TypeError, "messages must be a list of dicts, got NoneType"),
    ("hello", TypeError, r"got str: pass a list of \{\"role\""),
    ([{"x": 1}], ValueError, r"messages\[0\] is \{'x': 1\}, not a dict with a str 'role'"),
    ([{"role": "user", "content": None}], TypeError, r"messages\[0\]\['content'\] must be a str, got NoneType"),
    ([{"role": "user", "content": 5}], TypeError, r"messages\[0\]\['content'\] must be a str, got int")])
def test_malformed_messages_name_the_fix(smollm2, messages, error, match):
    with pytest.raises(error, match=match):
        smollm2.tokenizer.apply_chat_template(messages)
