"""Sections 一 and 九 measured: the chain from the input to [EOS] on a real answer, the FLOPs of 9 tokens in and 50
out, the one-second timings, and the full table: every section's own claims, 一 to 九, in the article's order."""
import dataclasses
import inspect

import pytest
import torch

import llmwalk as lw
from llmwalk import cost
from llmwalk.claims import autoregressive, embedding, journey as J, layers, lm_head, sampling, tokenization
from llmwalk.claims import cost as cost_claims
from llmwalk import i18n
from llmwalk.report import Verdict
from llmwalk.report import Claim

from markers import needs_gemma
from test_generate import hf_greedy

SECTIONS = ("一", "二", "三", "四", "五", "六", "七", "八", "九")     # claims.md, sections 1 to 9
MODULES = (tokenization, embedding, layers, lm_head, sampling, autoregressive, cost_claims, J)


pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py


@pytest.fixture(scope="module")
def chain(smollm2):
    return J.chain_run(smollm2)


@pytest.fixture(scope="module")
def rows(smollm2):
    return J.claims(smollm2)


# ---------------------------------------------------------------- the chain

def test_chain_every_link(smollm2, chain):
    trace, answer, passes = chain
    k = J.chain_check(smollm2, trace, answer, passes)
    t = len(smollm2.tokenizer.encode(J.ENGLISH, chat=True))
    assert k["tokens"] == t == len(answer.prompt_ids)
    assert k["embedding"] == (t, 576) and k["layers"] == 30 and k["final"] == (t, 576) and k["logits"] == (49152,)
    assert abs(k["softmax_sum"] - 1) < 1e-4
    # the loop: one pass per new token, each the previous input plus the token chosen after it, all 30 layers
    assert k["pass_lengths"] == list(range(t, t + len(answer.new_ids)))
    for a, b, step in zip(passes, passes[1:], answer.steps):
        assert b.ids[:-1] == a.ids and b.ids[-1] == step.token_id
    assert all(p.layers == 30 for p in passes)
    # a pass in which one layer changed nothing breaks the "full stack" link, and the chain with it
    short = [passes[0], dataclasses.replace(passes[1], layers=29), *passes[2:]]
    broken = J.chain_check(smollm2, trace, answer, short)
    assert not broken["full_stack"] and J.chain_verdict(broken) is Verdict.DIFFERS
    # it ends by itself, at the end token, with the answer
    assert answer.stopped == "eos" and answer.new_ids[-1] in smollm2.tokenizer.eos_token_ids
    assert "Paris" in answer.text
    assert J.chain_verdict(k) is Verdict.ROUGHLY                            # every link; the final norm left out
    shown = J.chain_table(smollm2, k)                                        # one row per link, every link named
    assert len(shown.rows) == len(k) == len(J.chain_links()) and shown.title.endswith("≈ roughly")
    assert dict(shown.rows)[J.chain_links()["full_stack"]] == "yes"              # a link that holds, in words
    assert dict(shown.rows)[J.chain_links()["stopped"]] == "the end token ('eos')"     # why, in words
    first = answer.new_ids[0]
    assert dict(shown.rows)[J.chain_links()["first"]] == f"{smollm2.tokenizer.pieces([first])[0]!r} (id {first})"


def test_chain_first_token_is_in_the_nucleus(smollm2, chain):
    trace, answer, _ = chain
    probs = torch.softmax(trace.logits[-1].double() / J.TEMPERATURE, -1)      # independent top-p, in float64
    p, order = probs.sort(descending=True)
    n = int((p.cumsum(0) < J.TOP_P).sum()) + 1                                # smallest top set reaching TOP_P
    assert answer.new_ids[0] in order[:n].tolist()
    k = J.chain_check(smollm2, *J.chain_run(smollm2, max_new_tokens=1))
    assert k["nucleus"] == n and k["first_in_nucleus"]


def test_chain_is_reproducible_and_needs_eos(smollm2, chain):
    _, answer, _ = chain
    trace, short, passes = J.chain_run(smollm2, max_new_tokens=3)             # same seed, cut before the end
    assert short.new_ids == answer.new_ids[:3] and short.stopped == "max_new_tokens"
    k = J.chain_check(smollm2, trace, short, passes)
    assert not k["ends_with_eos"] and J.chain_verdict(k) is Verdict.DIFFERS
    assert dict(J.chain_table(smollm2, k).rows)[J.chain_links()["stopped"]] == "max_new_tokens reached ('max_new_tokens')"


# ---------------------------------------------------------------- 9 in, 50 out, 18 B FLOPs

def test_budget_is_cost_py_and_the_article_rule():
    g = cost.gpt2_config()
    b = J.budget(g)
    assert b["article_rule"] == 50 * 3 * cost.n_params(g)
    assert b["kv_cache"] == cost.generation_flops(g, 9, 50)
    assert b["no_cache"] == cost.generation_flops(g, 9, 50, kv_cache=False) > b["kv_cache"]
    # independently: a position meets each layer weight once (a multiply-add, 2 FLOPs): the 9 prompt positions and
    # 49 new ones go through the layers (the 50th token is not run); the head runs once per new token
    layer_weights, head = g.n_layer * (4 * 768 * 768 + 2 * 768 * 3072), 768 * 50257
    matmuls = 2 * ((9 + 49) * layer_weights + 50 * head)
    assert 1 < b["kv_cache"] / matmuls < 1.01                        # the rest: attention over ≤ 58 keys, norms


def test_budget_claim(rows, smollm2):
    chain_row, budget_row = rows
    assert [r.section for r in rows] == ["九", "九"]
    g, m = J.budget(cost.gpt2_config()), J.budget(smollm2.config)
    assert budget_row.numbers == {"gpt2": g, "model": m} and budget_row.said == 18e9
    assert 18e9 / 2 < g["kv_cache"] < 18e9 / 1.1 and budget_row.verdict is Verdict.ROUGHLY  # within ×2, not 10 %
    assert f"{len(lw.gpt2_tokenizer().encode('法国的首都是什么？'))} tokens" in budget_row.measured
    assert chain_row.verdict is Verdict.ROUGHLY and chain_row.numbers["ends_with_eos"]   # final norm left out


@needs_gemma
def test_chain_claim_reports_gemma(smollm2, gemma):
    row = J._chain_claim(smollm2, gemma)
    g = lw.generate(gemma, J.GEMMA_PROMPT, J.GEMMA_TOKENS)
    assert repr(g.text) in row.measured and "巴黎" in g.text


# ---------------------------------------------------------------- section 一

def timed(j, stage: float, rounds: list[float]):
    """The journey `j` as if each of its first-token stages had taken `stage` seconds and its rounds `rounds`."""
    steps = [dataclasses.replace(s, seconds=r) for s, r in zip(j.answer.steps, rounds, strict=True)]
    return dataclasses.replace(j, seconds=dict.fromkeys(j.seconds, stage),
                               answer=dataclasses.replace(j.answer, steps=steps))


def test_one_second_claims(smollm2):
    j = lw.journey(smollm2, "The capital of France is", max_new_tokens=3)
    n = len(j.seconds)                                       # tokenize, embedding, 30 layers, norm, head, ...
    fast = timed(j, 0.001, [0.2, 0.1, 0.3])
    t = J.timings(fast)
    assert t == pytest.approx({"first_token": n * 0.001, "answer_first_token": 0.2, "per_token": 0.2,
                               "answer": 0.6, "tokens": 3})
    when, first = J.one_second_claims(smollm2, fast)
    assert {when.section, first.section} == {"一"}
    assert when.verdict is Verdict.HOLDS
    # the answer loop's own first token (200 ms), not the slower stage-by-stage pass that records every tensor
    assert f"first token 200 ms; the whole answer, 3 tokens, 600 ms (200 ms per token" in when.measured
    # the point is the first token within a second; the whole answer within it too is the detail
    assert J.one_second_claims(smollm2, timed(j, 0.001, [0.2, 0.5, 0.5]))[0].verdict is Verdict.ROUGHLY
    assert J.one_second_claims(smollm2, timed(j, 0.001, [1.2, 0.1, 0.1]))[0].verdict is Verdict.DIFFERS
    assert J.one_second_claims(smollm2, timed(j, 1 / n, [0.2, 0.1, 0.1]))[0].verdict is Verdict.HOLDS
    flops = sum(cost.flops_by_stage(smollm2.config, 5, last_only=True).values())
    assert f"{flops / 1e6:.4g} M FLOPs" in when.measured
    # only the English continuation, which gives ' Paris' first: nothing restated, so the detail "first" holds
    assert first.numbers == {"paris_first": True, "round": None, "restated": 0} and first.verdict is Verdict.HOLDS


def test_first_word_claims_are_notebook_01s_and_deterministic(smollm2, hf_smollm2):
    """all_claims' section 一: the 巴 claim on notebook 01's journeys, without the wall-clock one."""
    rows = J.first_word_claims(smollm2)
    assert len(rows) == 1 and rows[0].section == "一" and rows[0].article == i18n.t("claims.one.first_word.article")
    j = lw.journey(smollm2, "The capital of France is", max_new_tokens=8)
    zh = lw.journey(smollm2, "法国的首都是什么", chat=True, max_new_tokens=30)
    assert rows[0] == J.one_second_claims(smollm2, j, zh)[1] == J.first_word_claims(smollm2)[0]
    assert rows[0].numbers == {"paris_first": True, "round": None, "restated": 1}
    assert f"{zh.answer.text!r}" in rows[0].measured
    # the reference: transformers' greedy answer to the same chat prompt, where 巴 never comes (so: ≈, not ✓)
    theirs = hf_greedy(hf_smollm2, zh.ids, 30)
    assert zh.answer.new_ids == theirs and "巴" not in smollm2.tokenizer.decode(theirs)
    assert rows[0].verdict is Verdict.ROUGHLY
    assert J.one_second_claims(smollm2, j)[0].article == i18n.t("claims.one.one_second.article")


def test_first_word_round(smollm2):
    g = lw.generate(smollm2, "The capital of France is", max_new_tokens=2)
    assert J.first_word_round(smollm2, g, "Paris") == 1 and J.first_word_round(smollm2, g, "巴") is None


# ---------------------------------------------------------------- the full table

def test_all_claims_calls_every_section_in_order(monkeypatch):
    """all_claims asks each section's own module, 二 to 九, passing the models; nothing measured twice."""
    calls = []

    def stub(module):
        def claims(*args, **kwargs):
            inspect.signature(real[module.__name__]).bind(*args, **kwargs)   # the real function accepts these
            calls.append((module.SECTION, args, kwargs))
            return [Claim(module.SECTION, "said", "measured", Verdict.HOLDS)]
        return claims

    real = {m.__name__: m.claims for m in MODULES}
    for m in MODULES:
        monkeypatch.setattr(m, "claims", stub(m))

    def first_word_claims(*args, **kwargs):                                # section 一: its deterministic claim
        inspect.signature(real_first).bind(*args, **kwargs)
        calls.append(("一", args, kwargs))
        return [Claim("一", "said", "measured", Verdict.ROUGHLY)]

    real_first = J.first_word_claims
    monkeypatch.setattr(J, "first_word_claims", first_word_claims)
    model = type("M", (), {"config": type("C", (), {"name": "small"}), "tokenizer": "tok-small"})()
    gemma = type("M", (), {"config": type("C", (), {"name": "gemma"}), "tokenizer": "tok-gemma"})()
    seconds = {}
    rows = J.all_claims(model, gemma, seconds=seconds)
    assert tuple(r.section for r in rows) == SECTIONS == ("一", *(m.SECTION for m in MODULES))
    assert list(seconds) == list(SECTIONS) and all(s >= 0 for s in seconds.values())
    args = {section: (a, k) for section, a, k in calls}
    assert args["二"][0] == ({"small": "tok-small", "gemma": "tok-gemma"},)
    assert all(a[0] is model for s, (a, _) in args.items() if s != "二")
    for s in ("一", "五", "七", "九"):                                       # the Chinese rounds need Gemma
        assert gemma in args[s][0] or gemma in args[s][1].values()
    assert list(args["三"][0][1]) == [gemma]
    calls.clear()
    J.all_claims(model)                                                    # without Gemma: nothing breaks
    assert [s for s, _, _ in calls] == list(SECTIONS)
