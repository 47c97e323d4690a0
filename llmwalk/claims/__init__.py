"""The article's claims, measured: one module per article section, each with `claims(...) -> list[Claim]`.

A claim row holds the article's words (and its number, `said`), what we measured (`numbers`, and the prose formatted
from them) and a verdict from the one rule set, `llmwalk.report.Verdict`. The measurements live in the
stage modules when a notebook uses them beside the stage (embedding.neighbours, head.lens_path, sampling.entropy,
accuracy.compare_formats, cost.kv_cache_check) and here, in the section's module, when they serve that section's
claims (claims.layers.article_layer, claims.sampling.find_loop): nothing here is typed in.
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


def below(x: float, tol: str, *, zero: bool = False) -> str:
    """A number that is float round-off when below `tol` (written as the text shows it, e.g. "1e-04"): '< tol', so it
    reads the same on every machine; else 3 significant digits. zero=True writes an exact 0 as "0"."""
    if zero and x == 0:
        return "0"
    return f"< {tol}" if abs(x) < float(tol) else f"{x:.3g}"


def billions(x: float) -> str:
    """A count in billions, 4 significant digits: '18.43 B'."""
    return f"{x / 1e9:.4g} B"
