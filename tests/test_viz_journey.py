"""llmwalk.viz on whole journeys: the round table and chips of a slice of the rounds, the journey diagram (09)
and the pipeline diagram (01)."""
import dataclasses
import re

from viz_fixtures import PROMPT, pytestmark, texts  # noqa: F401  fixtures; first: Agg
from viz_fixtures import ENGLISH_QUESTION as QUESTION

import pytest
import torch
from matplotlib.figure import Figure

import llmwalk as lw
import llmwalk.viz as viz
from llmwalk.viz._draw import show_piece

@pytest.fixture(scope="module")
def answer(smollm2):
    return lw.generate(smollm2, PROMPT, 7)


@pytest.fixture(scope="module")
def chat_journey(smollm2):
    return lw.journey(smollm2, QUESTION, chat=True, max_new_tokens=20)


# ---------------------------------------------------------------- a slice of the rounds

def test_a_slice_with_its_prefix_shows_the_real_context(smollm2, answer):
    tok, g = smollm2.tokenizer, answer
    steps, prefix = g.steps[3:6], g.prompt_ids + g.new_ids[:3]
    table = viz.generation_table(steps, tok, prefix)
    assert [r[0] for r in table.rows] == ["第4轮", "第5轮", "第6轮"]
    whole = [show_piece(p) for p in tok.pieces(g.ids)]
    for row, step in zip(table.rows, steps):                 # round k saw the prompt and the k - 1 tokens before it
        assert row[1] == str(step.context_len) and row[4] == show_piece(step.token)
        assert row[3] == "[" + ", ".join(whole[:step.context_len]) + "]"
    drawn = texts(viz.generation_figure(steps, tok, prefix))
    assert "round 4" in drawn and "round 3" not in drawn
    assert all(p in drawn for p in whole[:steps[-1].context_len])   # the tokens chosen in rounds 1-3 are there
    full = viz.generation_table(g.steps, tok, g.prompt_ids)
    assert table.rows == full.rows[3:6]                        # the same rows as in the table of every round


@pytest.mark.parametrize("draw", [viz.generation_table, viz.generation_figure])
def test_a_slice_with_the_bare_prompt_raises(smollm2, answer, draw):
    g = answer
    with pytest.raises(ValueError, match=r"pass the prompt plus the tokens generated before steps\[0\]") as e:
        draw(g.steps[3:6], smollm2.tokenizer, g.prompt_ids)
    assert "g.new_ids[:3]" in str(e.value)
    with pytest.raises(ValueError, match="round 1 saw 5 tokens"):
        draw(g.steps, smollm2.tokenizer, g.prompt_ids[1:])     # too short a prompt: wrong from round 1


def test_table_adds_the_model_probability(smollm2, answer):
    table = viz.generation_table(answer.steps, smollm2.tokenizer, answer.prompt_ids)
    assert table.header[-2:] == ("p", "model p")
    assert [r[5] for r in table.rows] == ["1.00"] * 7                         # greedy: the drawn token had p = 1
    assert [r[6] for r in table.rows] == [f"{s.top[0][2]:.2f}" for s in answer.steps]   # greedy: the top token
    bare = [dataclasses.replace(s, top=()) for s in answer.steps]              # without the model's view
    assert len(viz.generation_table(bare, smollm2.tokenizer, answer.prompt_ids).header) == 6


# ---------------------------------------------------------------- the journey diagram

def test_journey_diagram_shows_every_stage_and_its_shape(chat_journey):
    j = chat_journey
    fig = viz.journey_diagram(j)
    assert isinstance(fig, Figure)
    drawn = texts(fig)
    boxes = [t for t in drawn if "\n" in t and not t.startswith("加回")]   # one box per stage: its name, its shape
    stages = j.stages()
    assert len(boxes) == len(stages) + 2                       # the input before, the token chosen after
    assert [b.split("\n", 1)[1] for b in boxes[1:-1]] == [shape for _, shape, _ in stages]
    names = [b.split("\n", 1)[0] for b in boxes]
    assert names[:4] == ["输入 (input)", "Token 化 (tokenize)", "Embedding", "30 × Attention/FFN"]   # the article's
    assert names[-4:] == ["LM Head (last position)", "Softmax", "pick a token (greedy)", "输出词 (output word)"]
    assert "[37, 576] → [37, 576]" in boxes[3] and "[576] → [49152] logits" in boxes[5]
    assert boxes[-1] == f"输出词 (output word)\n{show_piece(j.answer.steps[0].token)!r}"
    loop = next(t for t in drawn if t.startswith("加回输入 → 重复 (append to the input, repeat)"))
    steps = j.answer.steps
    assert f"rounds 2–{len(steps)}" in loop and "1 new token each (KV cache)" in loop
    assert j.answer.stopped == "eos" and loop.endswith(f"until {show_piece(steps[-1].token)} = [EOS]")
    assert any(t.startswith(f"round 1: the first token, {len(j.ids)} tokens in") for t in drawn)


def test_journey_diagram_in_chinese(chat_journey):
    """The Chinese diagram keeps the article's names and shows the stages' shapes (and the final norm) in Chinese."""
    lw.set_language("zh")
    try:
        drawn = texts(viz.journey_diagram(chat_journey))
    finally:
        lw.set_language("en")
    n = len(chat_journey.ids)
    assert f"Token 化\n文本 → {n} 个 id" in drawn and "最终归一化（最后一个位置）\n[576] → [576]" in drawn
    assert "LM Head（最后一个位置）\n[576] → [49152] 个 logit" in drawn and "Softmax\n[49152] 个概率" in drawn
    assert "30 × Attention/FFN" in "".join(drawn) and "输入\n'What is the capita…" in drawn
    assert any(t.startswith("加回输入 → 重复：第 2–") and "（含它自己）做注意力" in t for t in drawn)   # attends to: 对……做注意力


def test_journey_diagram_without_end_token(smollm2):
    j = lw.journey(smollm2, PROMPT, max_new_tokens=3)
    drawn = texts(viz.journey_diagram(j))
    assert "Embedding\n[5] → [5, 576]" in drawn and "输出词 (output word)\n'␣Paris'" in drawn
    assert any(t.endswith("stopped by max_new_tokens = 3: no [EOS]") for t in drawn)
    one = lw.journey(smollm2, PROMPT, max_new_tokens=1)
    assert any("no second round" in t for t in texts(viz.journey_diagram(one)))


# ---------------------------------------------------------------- the pipeline diagram (notebook 01)

def test_pipeline_diagram_shows_every_stage_its_value_and_its_notebook(smollm2):
    j = lw.journey(smollm2, PROMPT, max_new_tokens=4)
    drawn = texts(viz.pipeline_diagram(j, smollm2.tokenizer))
    boxes = [t for t in drawn if "\n" in t and not t.startswith("the loop")]
    names, values = zip(*(b.split("\n", 1) for b in boxes))
    assert [re.search(r"\((\d\d)\)$", n) and re.search(r"\((\d\d)\)$", n)[1] for n in names] == \
        [None, "02", "02", "03", "04", "04", "05", "05", "06"]          # text, then each stage's notebook, in order
    assert names[0] == "text" and names[4] == "30 layers: attention + FFN (04)" and names[5].startswith("final norm")
    ids = smollm2.tokenizer.encode(PROMPT)
    assert values[0] == repr(PROMPT) and values[2] == str(ids)
    assert values[1] == "|".join(show_piece(p) for p in smollm2.tokenizer.pieces(ids))
    assert values[3] == "[5] → [5, 576]" and values[5] == "[576] → [576]" and values[6] == "[49152] logits"
    p = torch.softmax(j.trace.logits[-1].double(), -1)                 # the probabilities, computed here
    assert values[7] == f"top '␣Paris', p = {float(p.max()):.2f}" and values[8] == "'␣Paris'"
    assert int(p.argmax()) == smollm2.tokenizer.encode(" Paris")[0]
    loop = next(t for t in drawn if t.startswith("the loop (07)"))
    assert "append '␣Paris' to the ids" in loop and "4 rounds write" in loop and repr(j.answer.text) in loop


def test_pipeline_diagram_in_chinese(smollm2):
    j = lw.journey(smollm2, PROMPT, max_new_tokens=2)
    lw.set_language("zh")
    try:
        drawn = texts(viz.pipeline_diagram(j, smollm2.tokenizer))
    finally:
        lw.set_language("en")
    assert "词块（02）\nThe|␣capital|␣of|␣France|␣is" in drawn and "最终归一化，最后一个位置（04）\n[576] → [576]" in drawn
    assert "LM Head（05）\n[49152] 个 logit" in drawn and "30 层：注意力 + FFN（04）\n[5, 576] → [5, 576]" in drawn
    assert any(t.startswith("循环（07）：把 '␣Paris' 接到 id 末尾") for t in drawn)
