"""The article's claims, measured: one module per article section, each with `claims(...) -> list[Claim]`.

A claim row holds the article's words (and its number, `said`), what we measured (`numbers`, and the prose formatted
from them) and a verdict from the one rule set, `llmwalk.report.Verdict`. The measurements themselves live in
`llmwalk.analysis` (and the stage modules): nothing here is typed in, and nothing here is a second analysis library.
Every notebook closes with its section's table; notebook 09 shows them all, one table per section.
"""
from ..i18n import t


def yes(x: bool) -> str:
    """yes / no in the current language."""
    return t("claims.common.yes") if x else t("claims.common.no")


def listed(items) -> str:
    """Items joined by the list separator of the current language ("a, b" / "a，b")."""
    return t("claims.common.list_sep").join(map(str, items))


def named(name: str, value) -> str:
    """'name: value' with the colon of the current language ("名称：值" in Chinese)."""
    return t("claims.common.named", name=name, value=value)
