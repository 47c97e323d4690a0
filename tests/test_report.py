from llmwalk.report import Claim, claims_table, table


def test_table_text_and_html():
    t = table([("Paris", 0.77251), ("London", 12)], ("token", "p"), title="top")
    assert repr(t).splitlines() == ["top", "token  | p", "-------+-------", "Paris  | 0.7725", "London | 12"]
    assert "<td style='text-align:left'>0.7725</td>" in t._repr_html_() and "<caption" in t._repr_html_()


def test_claims_table_escapes_html():
    t = claims_table([Claim("二", "<9 tokens>", "6", "✗ differs")])
    assert "&lt;9 tokens&gt;" in t._repr_html_()
    assert t.header == ("§", "the article says", "we measured", "verdict")


def test_table_pads_chinese_by_display_width():
    lines = repr(table([("第1轮", "巴"), ("round 10", "x")], ("round", "token"))).splitlines()
    assert lines[2] == "第1轮    | 巴" and lines[3] == "round 10 | x"
