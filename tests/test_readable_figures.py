"""Figures a learner must be able to read: byte pieces labelled by their character, the journey diagram wrapped to
the notebook's width, and the pass-cost plot drawing the numbers it is given."""
import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

import llmwalk as lw  # noqa: E402
import llmwalk.viz as viz  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py


def groups(labels):
    """Split labels into runs: a whole token alone, or the m pieces c[1/m] … c[m/m] of one character."""
    runs, k = [], 0
    while k < len(labels):
        if labels[k].endswith("]") and "[" in labels[k]:
            m = int(labels[k].rsplit("/", 1)[1][:-1])
            runs.append((k, m))
            k += m
        else:
            runs.append((k, 1))
            k += 1
    return runs


@pytest.mark.parametrize("text", ["人咬狗", "狗咬人", "法国的首都是什么？", "The man bites the dog"])
@pytest.mark.parametrize("which", ["smollm2", "gpt2"])
def test_piece_labels_name_the_character_each_piece_spells(smollm2, text, which):
    tok = smollm2.tokenizer if which == "smollm2" else lw.gpt2_tokenizer()
    ids = tok.text_ids(text)
    labels = viz.piece_labels(tok, ids)
    assert len(labels) == len(ids) and not any("\\x" in label for label in labels)
    chars = []
    for k, m in groups(labels):
        if m == 1 and not labels[k].endswith("/1]"):
            chars.append(tok.decode([ids[k]]))                       # a whole token: its own text
            continue
        char = labels[k][0]
        assert [label for label in labels[k:k + m]] == [f"{char}[{n}/{m}]" for n in range(1, m + 1)]
        # the m pieces' bytes are exactly the character's UTF-8 bytes (Python's encoder as the reference)
        assert b"".join(tok.token_bytes(i) for i in ids[k:k + m]) == char.encode("utf-8")
        chars.append(char)
    assert "".join(chars) == text


def test_piece_labels_known_cuts(smollm2):
    tok = smollm2.tokenizer
    assert viz.piece_labels(tok, tok.encode("人咬狗")) == ["人", "咬[1/3]", "咬[2/3]", "咬[3/3]",
                                                          "狗[1/3]", "狗[2/3]", "狗[3/3]"]
    gpt2 = lw.gpt2_tokenizer()
    assert viz.piece_labels(gpt2, [37345, 243, 21410]) == ["法[1/2]", "法[2/2]", "的"]   # 法 = e6 b3 | 95


@pytest.mark.parametrize("text", ["人咬狗", "法国的首都是什么？", "The man bites the dog"])
def test_the_chips_of_one_character_share_a_colour_and_no_one_else_does(text):
    """A character's byte fragments one colour (the learner sees 法 = \\xe6\\xb3 + \\x95); neighbours differ."""
    gpt2 = lw.gpt2_tokenizer()
    ids = gpt2.text_ids(text)
    colours = [chip.color for chip in viz.tokens.chips(gpt2, ids)]
    runs = groups(viz.piece_labels(gpt2, ids))                       # checked against UTF-8 above
    for k, m in runs:
        assert len(set(colours[k:k + m])) == 1, (text, k, m, colours)
    firsts = [colours[k] for k, _ in runs]
    assert all(a != b for a, b in zip(firsts, firsts[1:])), (text, colours)
    assert [chip.edge != "none" for chip in viz.tokens.chips(gpt2, ids)] == [gpt2.is_fragment(i) for i in ids]


def test_journey_diagram_fits_the_notebook_width(smollm2):
    j = lw.journey(smollm2, "What is the capital of France?", chat=True, max_new_tokens=4)
    fig = viz.journey_diagram(j)
    width_px = fig.get_figwidth() * fig.dpi
    assert width_px <= 900                                          # one row of boxes was 1775 px
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    page = fig.bbox
    boxes = [t.get_bbox_patch().get_window_extent(renderer) for t in fig.texts + fig.axes[0].texts
             if t.get_bbox_patch() is not None]
    assert len(boxes) == len(j.stages()) + 2
    for b in boxes:                                                  # every box on the page …
        assert page.x0 <= b.x0 and b.x1 <= page.x1 and page.y0 <= b.y0 and b.y1 <= page.y1
    for i, a in enumerate(boxes):                                    # … and no two boxes on top of each other
        assert not any(a.overlaps(b) for b in boxes[i + 1:])
    rows = {round(b.y0) for b in boxes}
    assert 2 <= len(rows) <= 4


def test_pass_cost_draws_the_counts_it_is_given():
    tokens, flops, read = [1, 2, 4], [2e8, 4e8, 8e8], [5.4e8, 5.4e8, 5.5e8]
    fig = viz.pass_cost(tokens, flops, read)
    lines = fig.axes[0].get_lines()
    assert [list(l.get_ydata()) for l in lines] == [flops, read]
    assert fig.axes[0].get_ylabel() == "FLOPs or bytes, per pass"          # the axis names both lines' units
    assert [a.get_text() for a in fig.axes[0].texts] == ["550 MB"]          # the flat line's size, written out
    timed = viz.pass_cost(tokens, flops, read, seconds=[0.02, 0.021, 0.024])
    per_pass, per_token = timed.axes[1].get_lines()
    np.testing.assert_allclose(per_token.get_ydata(), [20.0, 10.5, 6.0])   # ms per token = ms per pass / tokens
    assert list(per_pass.get_xdata()) == tokens


@pytest.mark.parametrize("labels", [["<bos>", "法国", "的首", "都是", "什么", "？"],
                                    ["狗[1/3]", "狗[2/3]", "狗[3/3]", "咬[1/3]", "咬[2/3]", "咬[3/3]", "人"]])
def test_chinese_column_labels_stand_upright_without_overlapping(labels):
    """Chinese turned on its side reads badly (issue 26): a heatmap's CJK column labels stay horizontal, in a font
    small enough that no two of them overlap; labels without CJK longer than 2 characters still stand on their side."""
    from llmwalk.viz._draw import heatmap, new_figure
    fig = new_figure(3.6, 3.0)                      # at 10 points, seven labels like 狗[1/3] would overlap here
    ax = fig.subplots()
    heatmap(ax, np.zeros((len(labels), len(labels))), labels, labels)
    FigureCanvasAgg(fig).draw()
    ticks = ax.get_xticklabels()
    assert [tick.get_rotation() for tick in ticks] == [0] * len(labels)
    boxes = [tick.get_window_extent() for tick in ticks]
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:])), [(b.x0, b.x1) for b in boxes]
    fig = new_figure(4.5, 3.5)
    ax = fig.subplots()
    heatmap(ax, np.zeros((3, 3)), ["The", " capital", " of"], ["a", "b", "c"])
    assert {tick.get_rotation() for tick in ax.get_xticklabels()} == {90}
