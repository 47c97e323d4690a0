import pytest

import llmwalk as lw
from llmwalk.i18n import t
from llmwalk.report import (Claim, Verdict, claims_by_section, claims_table, table,
                            verdict_rules)


def test_table_text_and_html():
    t = table([("Paris", 0.77251), ("London", 12)], ("token", "p"), title="top")
    assert repr(t).splitlines() == ["top", "token  | p", "-------+-------", "Paris  | 0.7725", "London | 12"]
    assert "<td style='text-align:left'>0.7725</td>" in t._repr_html_() and "<caption" in t._repr_html_()


def test_claims_table_escapes_html_and_links_to_the_rules_printed_once():
    shown = claims_table([Claim("二", "<9 tokens>", "6", Verdict.DIFFERS)])
    assert "&lt;9 tokens&gt;" in shown._repr_html_() and "<tfoot>" in shown._repr_html_()
    assert shown.header == ("§", "the article says", "we measured", "verdict")
    assert shown.rows == (("二", "<9 tokens>", "6", "✗ differs"),)
    # the rules are printed once, under the first table a learner meets (section 一's, notebook 01); the others link
    assert repr(shown).endswith(t("report.rules_elsewhere", notebook="01_one_second.ipynb"))
    assert "<a href='01_one_second.ipynb'>" in shown._repr_html_() and verdict_rules() not in repr(shown)
    first = claims_table([Claim("一", "a second", "2 s", Verdict.DIFFERS)])
    assert repr(first).endswith(verdict_rules()) and first.link == ""
    assert claims_table([Claim("二", "a", "1", Verdict.HOLDS)], rules=False).note == ""


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


def test_verdict_of_a_number_measured_as_zero_is_off_by_more_than_any_factor():
    assert Verdict.of_number(0, 0.042) is Verdict.DIFFERS
    for measured, said in ((-1, 0.042), (1, 0), (1, -2)):
        with pytest.raises(ValueError, match="positive"):
            Verdict.of_number(measured, said)


@pytest.mark.parametrize("point, details, numbers, expected", [
    (True, True, [(0.042, 0.042), (0.017, 0.018)], Verdict.HOLDS),
    (True, False, [(0.042, 0.042)], Verdict.ROUGHLY),                  # a detail does not hold
    (True, True, [(0.06, 0.042)], Verdict.ROUGHLY),                    # a number within ×2, not within 10 %
    (True, True, [(0.778, 0.042), (0.0002, 0.018)], Verdict.DIFFERS),  # 05's rows: ×18 and ×90 off
    (True, False, [(0.042, 0.042), (0.001, 0.018)], Verdict.DIFFERS),  # one number beyond ×2 is enough
    (False, True, [(0.042, 0.042)], Verdict.DIFFERS)])
def test_verdict_of_a_point_its_details_and_its_numbers(point, details, numbers, expected):
    assert Verdict.of(point, details, numbers=numbers) is expected


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
    assert [t.note for t in shown.tables] == [verdict_rules(), ""]    # the rules once, under the first table


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
    assert shown.header == ("§", "文章说的", "我们测到的", "判定") and shown.title == "文章说的 / 我们测到的"
    assert [r[-1] for r in shown.rows] == ["✓ 成立", "≈ 大致成立"]
    assert shown.note == "判定遵循笔记本 01_one_second.ipynb 论断表下面打印的那一套规则。"
    rules = verdict_rules()
    assert rules.startswith("判定规则") and "✓ 成立：" in rules and "10%" in rules and "2 倍" in rules
    assert [t.title for t in claims_by_section(rows).tables] == [
        "第二节：1 条论断 — 笔记本 02_tokenization.ipynb", "第三节：1 条论断 — 笔记本 03_embedding.ipynb"]
