"""The language tables: English and Chinese hold the same keys with the same placeholders, every key the code asks
for exists, no key sits unused, and a wrong language or a missing key is refused with an error naming the fix."""
import ast
from pathlib import Path

import pytest

import llmwalk as lw
from llmwalk import i18n
from llmwalk.i18n import placeholders, t, table

PACKAGE = Path(i18n.__file__).parent
DYNAMIC: dict[str, str] = {     # key prefix -> why the code builds such keys at run time (read with table(), not t())
    "viz.stage.": "viz.cost.stage_label names the stage identifiers of cost.flops_by_stage and timed_forward"}


def _t_calls() -> list[tuple[str, ast.Call]]:
    """Every call of i18n's t in llmwalk's source, as (file:line, call): `t(...)` where the module imports t from
    i18n, and `i18n.t(...)` anywhere."""
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        imports_t = any(isinstance(node, ast.ImportFrom) and (node.module or "").endswith("i18n")
                        and any(alias.name == "t" and alias.asname is None for alias in node.names)
                        for node in ast.walk(tree))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (
                    (imports_t and isinstance(node.func, ast.Name) and node.func.id == "t")
                    or (isinstance(node.func, ast.Attribute) and node.func.attr == "t"
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "i18n")):
                calls.append((f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", node))
    return calls


def _literal(call: ast.Call) -> str | None:
    first = call.args[0] if call.args else None
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _used_keys() -> dict[str, str]:
    return {key: where for where, call in _t_calls() if (key := _literal(call)) is not None}


def test_the_scan_finds_the_code_that_asks_for_texts():
    """A scan that found nothing would make the next tests pass vacuously."""
    used = _used_keys()
    assert "exercises.grader.passed" in used and len(used) > 100


def test_english_and_chinese_have_the_same_keys():
    en, zh = set(table("en")), set(table("zh"))
    assert not en - zh, f"missing in llmwalk/strings/zh/: {sorted(en - zh)}"
    assert not zh - en, f"missing in llmwalk/strings/en/: {sorted(zh - en)}"


def test_each_key_has_the_same_placeholders_in_both_languages():
    en, zh = table("en"), table("zh")
    differ = {key: (placeholders(en[key]), placeholders(zh[key])) for key in en.keys() & zh.keys()
              if placeholders(en[key]) != placeholders(zh[key])}
    assert not differ, f"placeholders differ (en, zh): {differ}"


def test_every_key_is_a_string_literal():
    """t(f"...") or t(name) hides a key from this scan; spell each key out (or list its prefix in DYNAMIC)."""
    dynamic = [where for where, call in _t_calls() if _literal(call) is None]
    assert not dynamic, f"t() called without a string literal key at {dynamic}"


@pytest.mark.parametrize("language", ["en", "zh"])
def test_every_key_the_code_uses_exists(language):
    texts = table(language)
    missing = {key: where for key, where in _used_keys().items() if key not in texts}
    assert not missing, f"keys used but not in llmwalk/strings/{language}/: {missing}"


def test_no_key_is_unused():
    used = _used_keys()
    unused = sorted(key for key in table("en") if key not in used and not key.startswith(tuple(DYNAMIC)))
    assert not unused, f"keys in llmwalk/strings/ that no code asks for (remove them): {unused}"


def test_a_text_comes_out_in_the_current_language_with_its_fields():
    try:
        lw.set_language("zh")
        assert lw.language() == "zh" and t("exercises.grader.passed", n=5) == "公开检查全部通过（5 个用例），做得好！"
    finally:
        lw.set_language("en")
    assert t("exercises.grader.passed", n=5) == "public checks passed: all 5 cases. Well done!"


def test_set_language_refuses_an_unknown_language_naming_the_choices():
    with pytest.raises(ValueError, match=r"set_language takes one of 'en', 'zh', got 'fr'"):
        lw.set_language("fr")
    assert lw.language() == "en"


def test_a_missing_key_names_the_file_to_add_it_to():
    with pytest.raises(KeyError, match=r"llmwalk/strings/en/.*exercises\.toml of every language"):
        t("exercises.no_such.text")
