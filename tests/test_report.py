import pytest

import llmwalk as lw
from llmwalk.report import (Claim, Verdict, claims_by_section, claims_table, table,
                            verdict_rules)


def test_table_text_and_html():
    t = table([("Paris", 0.77251), ("London", 12)], ("token", "p"), title="top")
    assert repr(t).splitlines() == ["top", "token  | p", "-------+-------", "Paris  | 0.7725", "London | 12"]
    assert "<td style='text-align:left'>0.7725</td>" in t._repr_html_() and "<caption" in t._repr_html_()


def test_claims_table_escapes_html_and_shows_the_rules_once_under_the_rows():
    t = claims_table([Claim("二", "<9 tokens>", "6", Verdict.DIFFERS)])
    assert "&lt;9 tokens&gt;" in t._repr_html_() and "<tfoot>" in t._repr_html_()
    assert t.header == ("§", "the article says", "we measured", "verdict")
    assert t.rows == (("二", "<9 tokens>", "6", "✗ differs"),)
    assert repr(t).endswith(verdict_rules())


def test_table_pads_chinese_by_display_width():
    lines = repr(table([("第1轮", "巴"), ("round 10", "x")], ("round", "token"))).splitlines()
    assert lines[2] == "第1轮    | 巴" and lines[3] == "round 10 | x"


# ---------------------------------------------------------------- the one verdict rule set

def test_verdict_of_a_point_and_its_details():
    assert Verdict.of(True) is Verdict.of(True, True) is Verdict.HOLDS
    assert Verdict.of(True, False) is Verdict.ROUGHLY
    assert Verdict.of(False, True) is Verdict.of(False, False) is Verdict.DIFFERS


@pytest.mark.parametrize("measured, said, expected", [
    (100, 100, Verdict.HOLDS), (110, 100, Verdict.HOLDS), (100, 110, Verdict.HOLDS),        # within 10 %, both ways
    (111, 100, Verdict.ROUGHLY), (100, 111, Verdict.ROUGHLY),
    (200, 100, Verdict.ROUGHLY), (100, 200, Verdict.ROUGHLY),                              # a factor of 2 exactly
    (201, 100, Verdict.DIFFERS), (0.778, 0.042, Verdict.DIFFERS)])
def test_verdict_of_a_number_by_its_ratio(measured, said, expected):
    assert Verdict.of_number(measured, said) is expected


def test_verdict_of_a_number_refuses_what_has_no_ratio():
    with pytest.raises(ValueError, match="positive"):
        Verdict.of_number(0, 0.042)


def test_verdicts_print_as_their_symbols_and_a_claim_takes_only_a_verdict():
    assert [str(v) for v in Verdict] == ["✓ holds", "≈ roughly", "✗ differs", "— not checkable here"]
    with pytest.raises(TypeError, match="Verdict"):
        Claim("二", "said", "measured", "✓ holds")


def test_claims_by_section_one_table_per_section_linking_its_notebook():
    rows = [Claim("二", "a", "1", Verdict.HOLDS), Claim("三", "b", "2", Verdict.ROUGHLY),
            Claim("二", "c", "3", Verdict.DIFFERS)]
    shown = claims_by_section(rows)
    assert [len(t.rows) for t in shown.tables] == [2, 1]
    assert shown.links == ("02_tokenization.ipynb", "03_embedding.ipynb")
    assert "href='02_tokenization.ipynb'" in shown._repr_html_()
    assert [bool(t.note) for t in shown.tables] == [False, True]     # the rules once, under the last table


@pytest.fixture
def chinese():
    lw.set_language("zh")
    yield
    lw.set_language("en")


def test_in_chinese_the_labels_change_and_the_verdicts_do_not(chinese):
    rows = [Claim("二", "a", "1", Verdict.of(True)), Claim("三", "b", "2", Verdict.of_number(150, 100))]
    assert [c.verdict for c in rows] == [Verdict.HOLDS, Verdict.ROUGHLY]          # the same members as in English
    assert [str(v) for v in Verdict] == ["✓ 成立", "≈ 大致成立", "✗ 不符", "— 此处无法检验"]
    shown = claims_table(rows)
    assert shown.header == ("§", "文章说", "我们测得", "判定") and shown.title == "文章说 / 我们测得"
    assert [r[-1] for r in shown.rows] == ["✓ 成立", "≈ 大致成立"]
    assert shown.note.startswith("判定 — ✓ 成立") and "10%" in shown.note and "×2" in shown.note
    assert [t.title for t in claims_by_section(rows).tables] == [
        "第二节：1 条论断 — 笔记本 02_tokenization.ipynb", "第三节：1 条论断 — 笔记本 03_embedding.ipynb"]
