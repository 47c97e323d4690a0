"""Section 九's claims, measured, and every section's claims in one list (notebook 09's closing table).

`claims(model, gemma=None)` checks the conclusion's two sentences: the whole chain, from the input to [EOS], on a
real answer that stops by itself; and "9 tokens in, 50 out, about 18 billion FLOPs", counted for GPT-2 small's
architecture and for the model passed in, with and without a KV cache. `one_second_claims` measures section 一.
`all_claims` calls section 一's deterministic claim (first_word_claims) and every other section's own `claims`
(二 to 九, in the article's order): nothing is measured twice here.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

import torch

from .. import cost, prompts
from ..generation import Generation, Pass, generate
from ..i18n import quoted, t
from . import billions, listed, yes
from ..report import Claim, Table, Verdict, table
from ..sampling import probs_after
from ..tokens import gpt2_tokenizer
from ..journey import journey as run_journey
from ..walk import Trace, forward
from .autoregressive import GEMMA_PROMPT, QUESTION, recorded_passes
from .sampling import TOP_P
from .tokenization import QUESTION_MARKED

if TYPE_CHECKING:
    from ..journey import Journey
    from ..models import Model

SECTION = "九"
ENGLISH = prompts.ENGLISH_QUESTION           # SmolLM2, chat template: one sentence, then the end token
TEMPERATURE, SEED = 0.7, 0                   # "Top-P 采样" with a chat temperature (section 六: T ≈ 0.7–1.0)
PROMPT_LEN, NEW_TOKENS = 9, 50               # "输入 9 个 Token、输出 50 个 Token"
ARTICLE_FLOPS = 18e9                         # "一次推理约 180 亿次浮点运算"
GEMMA_TOKENS = 20                            # rounds given to Gemma-3 (a base model) on the Chinese question
# notebook 01's three greedy journeys: the sentence SmolLM2 continues, QUESTION in its chat template, GEMMA_PROMPT
CONTINUE, CONTINUE_TOKENS = prompts.PROMPT, 8
QUESTION_TOKENS, GEMMA_ANSWER_TOKENS = 30, 6   # 30: notebook 01 runs to the end of a clause (，)


# ---------------------------------------------------------------- section 一: the one second

def timings(j: "Journey") -> dict[str, float]:
    """Wall-clock seconds of a journey: its recording pass stage by stage (j.seconds), and the answer loop's time to
    the first token and per later token (Generation.time_to_first_token, 1 / Generation.tokens_per_second).

    These change from run to run and machine to machine: show them in a cell nbval ignores.
    """
    a = j.answer
    return {"first_token": sum(j.seconds.values()), "answer_first_token": a.time_to_first_token,
            "per_token": 1 / a.tokens_per_second, "answer": sum(s.seconds for s in a.steps), "tokens": len(a.steps)}


def first_word_round(model: "Model", g: Generation, word: str) -> int | None:
    """The round in which `word` is complete in the answer (1 = the first token), None if it never is."""
    for k in range(1, len(g.new_ids) + 1):
        if word in model.tokenizer.decode(g.new_ids[:k]):
            return k
    return None


def one_second_claims(model: "Model", j: "Journey", zh: "Journey | None" = None, gemma: "Model | None" = None,
                      gemma_j: "Journey | None" = None) -> list[Claim]:
    """Section 一: "a second later the answer is on screen", and "巴" is the first word to appear.

    j: the journey of an English prompt; zh: the chat-templated Chinese question on the same model; gemma_j:
    Gemma-3's journey on GEMMA_PROMPT. The first row holds wall-clock times: it is different on every run.
    """
    s, c = timings(j), model.config
    first = sum(cost.flops_by_stage(c, len(j.ids), last_only=True).values())
    whole = cost.generation_flops(c, len(j.ids), s["tokens"])
    # the point: an answer within a second; the detail: all of it (≈ when only the first token makes it). Both
    # from the answer loop itself: the stage-by-stage pass records every tensor on the way and is slower
    when = Verdict.of(s["answer_first_token"] < 1, s["answer"] < 1)
    return [Claim("一", t("claims.one.one_second.article"),
                  t("claims.one.one_second.measured", model=c.name, threads=torch.get_num_threads(),
                    prompt=quoted(j.prompt), first_ms=f"{1000 * s['answer_first_token']:.0f}", tokens=s["tokens"],
                    answer_ms=f"{1000 * s['answer']:.0f}", per_token_ms=f"{1000 * s['per_token']:.0f}",
                    first_mflops=f"{first / 1e6:.4g}", answer_gflops=f"{whole / 1e9:.4g}"), when, numbers=s,
                  key="one.one_second"),
            first_word_claim(model, j, zh, gemma, gemma_j)]


def first_word_claim(model: "Model", j: "Journey", zh: "Journey | None" = None, gemma: "Model | None" = None,
                     gemma_j: "Journey | None" = None) -> Claim:
    """Section 一's picture, "from Enter until 巴 appears": which token comes first, and when 巴 does (greedy)."""
    def piece(m: "Model", i: int) -> str:
        return quoted(m.tokenizer.decode([i]))

    said = [t("claims.one.first_word.continued", model=model.config.name, prompt=quoted(j.prompt),
              piece=piece(model, j.first_token), p=f"{float(j.probs[j.first_token]):.3g}")]
    if zh is not None:
        said.append(t("claims.one.first_word.chat", prompt=quoted(zh.prompt), piece=piece(model, zh.first_token),
                      text=quoted(zh.answer.text)))
    round_ = None
    if gemma_j is not None and gemma is not None:
        round_ = first_word_round(gemma, gemma_j.answer, "巴")
        where = (t("claims.one.first_word.gemma_round", round=round_) if round_
                 else t("claims.one.first_word.gemma_none"))
        said.append(t("claims.one.first_word.gemma", prompt=quoted(gemma_j.prompt), piece=piece(gemma, gemma_j.first_token),
                      text=quoted(gemma_j.answer.text), where=where))
    paris_first = "Paris" in model.tokenizer.decode([j.first_token])
    restated = [g for g in (zh, gemma_j) if g is not None and not g.answer.text.startswith("巴")]
    note = t("claims.one.first_word.restated") if restated else ""
    # the point: 巴/Paris comes out of the first rounds; the detail, "first", fails when a model restates the question
    verdict = Verdict.of(bool(paris_first or round_), not restated)
    return Claim("一", t("claims.one.first_word.article"), t("claims.common.sep").join(said) + note, verdict,
                 numbers={"paris_first": paris_first, "round": round_, "restated": len(restated)},
                 key="one.first_word")


def first_word_claims(model: "Model", gemma: "Model | None" = None) -> list[Claim]:
    """Section 一's claims that give the same result on every run, on notebook 01's three greedy journeys.

    Only "巴 appears first": the other, "a second later the answer is on the screen", is a wall-clock time
    (one_second_claims, notebook 01), different on every run and machine.
    """
    j = run_journey(model, CONTINUE, max_new_tokens=CONTINUE_TOKENS)
    zh = run_journey(model, QUESTION, chat=True, max_new_tokens=QUESTION_TOKENS)
    gemma_j = run_journey(gemma, GEMMA_PROMPT, max_new_tokens=GEMMA_ANSWER_TOKENS) if gemma is not None else None
    return [first_word_claim(model, j, zh, gemma, gemma_j)]


# ---------------------------------------------------------------- the chain, measured

def chain_run(model: "Model", prompt: str = ENGLISH, chat: bool = True, max_new_tokens: int = NEW_TOKENS,
              temperature: float = TEMPERATURE, top_p: float = TOP_P,
              seed: int = SEED) -> tuple[Trace, Generation, list[Pass]]:
    """The article's chain on one prompt: the first pass traced in full, then the loop as the article runs it.

    The loop samples with top-p and temperature and reruns the whole sequence every round (no KV cache), so
    every recorded pass holds the previous pass's tokens plus the token chosen after it.
    """
    ids = model.tokenizer.encode(prompt, chat=chat)
    trace = forward(model, ids)
    with recorded_passes() as passes:
        answer = generate(model, ids, max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                          kv_cache=False)
    return trace, answer, passes


def chain_check(model: "Model", trace: Trace, answer: Generation, passes: Sequence[Pass],
                temperature: float = TEMPERATURE, top_p: float = TOP_P) -> dict:
    """Every link of the article's chain, checked on chain_run's result."""
    c, n = model.config, len(answer.prompt_ids)
    probs = trace.probs[-1]
    nucleus = probs_after(trace.logits[-1], temperature, top_p=top_p)
    first = answer.new_ids[0]
    return {
        "tokens": n,
        "embedding": tuple(trace.x0.shape),
        "layers": len(trace.layers),
        "layer_shapes_kept": all(tuple(b.resid_post.shape) == (n, c.d_model) for b in trace.layers),
        "final": tuple(trace.final.shape),
        "logits": tuple(trace.logits[-1].shape),
        "softmax_sum": float(probs.sum()),
        "nucleus": int((nucleus > 0).sum()),
        "first": first,
        "first_in_nucleus": bool(nucleus[first] > 0),
        "same_first_pass": passes[0].ids == tuple(answer.prompt_ids),
        "appended": all(b.ids == a.ids + (s.token_id,) for a, b, s in zip(passes, passes[1:], answer.steps)),
        "full_stack": all(p.layers == c.n_layer for p in passes),
        "pass_lengths": [len(p.ids) for p in passes],
        "rounds": len(answer.steps),
        "stopped": answer.stopped,
        "ends_with_eos": answer.stopped == "eos" and answer.new_ids[-1] in model.eos_ids,
    }


def chain_links() -> dict[str, str]:
    """chain_check's keys, as the table names them in the current language."""
    return {"tokens": t("claims.journey.chain_table.tokens"), "embedding": t("claims.journey.chain_table.embedding"),
            "layers": t("claims.journey.chain_table.layers"),
            "layer_shapes_kept": t("claims.journey.chain_table.layer_shapes_kept"),
            "final": t("claims.journey.chain_table.final"), "logits": t("claims.journey.chain_table.logits"),
            "softmax_sum": t("claims.journey.chain_table.softmax_sum"),
            "nucleus": t("claims.journey.chain_table.nucleus"), "first": t("claims.journey.chain_table.first"),
            "first_in_nucleus": t("claims.journey.chain_table.first_in_nucleus"),
            "same_first_pass": t("claims.journey.chain_table.same_first_pass"),
            "appended": t("claims.journey.chain_table.appended"),
            "full_stack": t("claims.journey.chain_table.full_stack"),
            "pass_lengths": t("claims.journey.chain_table.pass_lengths"),
            "rounds": t("claims.journey.chain_table.rounds"), "stopped": t("claims.journey.chain_table.stopped"),
            "ends_with_eos": t("claims.journey.chain_table.ends_with_eos")}


def chain_table(model: "Model", check: dict) -> Table:
    """chain_check's result as a table, one link a row, the verdict in the title."""
    show = {"first": lambda i: t("claims.journey.chain_table.first_value", piece=quoted(model.tokenizer.pieces([i])[0]),
                                 id=i),
            "pass_lengths": listed,
            "stopped": lambda why: {"eos": t("claims.journey.chain_table.stopped_eos"),
                                    "max_new_tokens": t("claims.journey.chain_table.stopped_max_new_tokens")}[why]}
    links = chain_links()
    as_is = lambda x: yes(x) if isinstance(x, bool) else x                                 # noqa: E731
    rows = [(links[k], show.get(k, as_is)(v)) for k, v in check.items()]
    return table(rows, (t("claims.journey.chain_table.link"), t("claims.journey.chain_table.value")),
                 t("claims.journey.chain_table.title", verdict=chain_verdict(check)))


def chain_verdict(check: dict) -> Verdict:
    """The point: every link holds and the answer stops at the end token by itself. The detail, the chain as the
    article lists it, does not hold: it leaves out the final norm (as section 八's list of steps does)."""
    links = ("layer_shapes_kept", "first_in_nucleus", "same_first_pass", "appended", "full_stack", "ends_with_eos")
    return Verdict.of(all(check[k] for k in links) and abs(check["softmax_sum"] - 1) < 1e-4, False)


def _chain_claim(model: "Model", gemma: "Model | None") -> Claim:
    trace, answer, passes = chain_run(model)
    k, c = chain_check(model, trace, answer, passes), model.config
    piece = lambda i: quoted(model.tokenizer.pieces([i])[0])                                   # noqa: E731
    lens = k["pass_lengths"]
    rerun = k["appended"] and k["full_stack"]
    text = t("claims.journey.chain.measured", model=c.name, prompt=quoted(ENGLISH), tokens=k["tokens"],
             emb0=k["embedding"][0], emb1=k["embedding"][1], n_layer=k["layers"], d_model=c.d_model,
             logits=k["logits"][0], total=f"{k['softmax_sum']:.4f}", top_p=TOP_P, temperature=TEMPERATURE,
             nucleus=k["nucleus"], first=piece(k["first"]), passes=len(lens), len_first=lens[0],
             len_second=lens[1] if len(lens) > 1 else "", len_last=lens[-1],
             rerun=yes(rerun), last=piece(answer.new_ids[-1]),
             stopped=repr(answer.stopped), rounds=k["rounds"], text=quoted(answer.text))
    if gemma is not None:
        g = generate(gemma, GEMMA_PROMPT, GEMMA_TOKENS)
        end = (t("claims.journey.chain.gemma_end") if g.stopped == "eos"
               else t("claims.journey.chain.gemma_no_end", n=GEMMA_TOKENS))
        text += t("claims.journey.chain.gemma", prompt=quoted(GEMMA_PROMPT), text=quoted(g.text), end=end)
    return Claim(SECTION, t("claims.journey.chain.article"), text, chain_verdict(k), numbers=k, key="journey.chain")


# ---------------------------------------------------------------- 9 in, 50 out, 18 billion FLOPs

def budget(config, prompt_len: int = PROMPT_LEN, new_tokens: int = NEW_TOKENS) -> dict[str, int]:
    """The three totals of one answer that the table shows, from cost.article_estimate: with a KV cache, without,
    and the article's rule (N × 3 × params)."""
    e = cost.article_estimate(config, prompt_len, new_tokens)
    return {"kv_cache": e["flops_answer_kv_cache"], "no_cache": e["flops_answer_no_cache"],
            "article_rule": e["article_flops_answer"]}


def _budget_claim(model: "Model") -> Claim:
    gpt2 = cost.gpt2_small(model)
    g, m = budget(gpt2), budget(model.config)
    n_question = len(gpt2_tokenizer().encode(QUESTION_MARKED))
    return Claim(SECTION, t("claims.journey.budget.article", prompt=PROMPT_LEN, n=NEW_TOKENS),
                 t("claims.journey.budget.measured", prompt=PROMPT_LEN, n=NEW_TOKENS, cached=billions(g["kv_cache"]),
                   ratio=f"{g['kv_cache'] / ARTICLE_FLOPS:.2f}", rerun=billions(g["no_cache"]),
                   params=f"{cost.n_params(gpt2) / 1e6:.1f}", rule=billions(g["article_rule"]), model=model.config.name,
                   m_cached=billions(m["kv_cache"]), m_rerun=billions(m["no_cache"]), question=QUESTION_MARKED,
                   question_tokens=n_question),
                 Verdict.of_number(g["kv_cache"], ARTICLE_FLOPS), numbers={"gpt2": g, "model": m}, said=ARTICLE_FLOPS,
                 key="journey.budget")


def claims(model: "Model", gemma: "Model | None" = None) -> list[Claim]:
    """Section 九, measured on `model` (SmolLM2 offline); Gemma-3's Chinese answer is added when `gemma` is given."""
    return [_chain_claim(model, gemma), _budget_claim(model)]


# ---------------------------------------------------------------- every section

def all_claims(model: "Model", gemma: "Model | None" = None, seconds: dict[str, float] | None = None) -> list[Claim]:
    """Every section's claims (一 to 九) in the article's order, each measured by its own module.

    Section 一 gives only its deterministic claim (first_word_claims): its "within one second" is a wall-clock
    time. Pass a dict as `seconds` to get the wall time each section took (by section number).
    """
    from . import autoregressive, cost as cost_claims, embedding, layers, lm_head, sampling, tokenization
    others = [m for m in (gemma,) if m is not None]
    sections = (("一", lambda: first_word_claims(model, gemma)),
                ("二", lambda: tokenization.claims({m.config.name: m.tokenizer for m in (model, *others)})),
                ("三", lambda: embedding.claims(model, others)),
                ("四", lambda: layers.claims(model)),
                ("五", lambda: lm_head.claims(model, gemma)),
                ("六", lambda: sampling.claims(model)),
                ("七", lambda: autoregressive.claims(model, gemma)),
                ("八", lambda: cost_claims.claims(model)),
                ("九", lambda: claims(model, gemma)))
    rows: list[Claim] = []
    for section, measure in sections:
        tic = time.perf_counter()
        rows += measure()
        if seconds is not None:
            seconds[section] = time.perf_counter() - tic
    return rows
