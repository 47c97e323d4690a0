"""Small tables for notebooks: plain text for terminals and nbval, HTML for Jupyter. No pandas needed."""
from __future__ import annotations

import html
import math
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from .i18n import t


def _width(s: str) -> int:
    """Columns a string takes in a terminal: CJK characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)


def _pad(s: str, width: int) -> str:
    return s + " " * (width - _width(s))


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@dataclass(frozen=True)
class Table:
    """Rows under a header; shows as an HTML table in Jupyter and as aligned text elsewhere."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    title: str = ""
    note: str = ""            # a line under the rows (the claims tables: the verdict rules, or where they are)
    link: str = ""            # where the note links to, in HTML

    def __repr__(self) -> str:
        cells = [list(self.header)] + [list(r) for r in self.rows]
        widths = [max(_width(c) for row in cells for c in [row[i]]) for i in range(len(self.header))]
        fmt = lambda row: " | ".join(_pad(c, w) for c, w in zip(row, widths)).rstrip()   # noqa: E731
        lines = ([self.title] if self.title else []) + [fmt(cells[0]), "-+-".join("-" * w for w in widths)]
        return "\n".join(lines + [fmt(r) for r in cells[1:]] + ([self.note] if self.note else []))

    def _repr_html_(self) -> str:
        esc = lambda s: html.escape(s).replace("\n", "<br>")                                  # noqa: E731
        head = "".join(f"<th style='text-align:left'>{esc(h)}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{esc(c)}</td>" for c in r) + "</tr>"
                       for r in self.rows)
        caption = f"<caption style='text-align:left'><b>{esc(self.title)}</b></caption>" if self.title else ""
        note = f"<a href='{html.escape(self.link)}'>{esc(self.note)}</a>" if self.link else esc(self.note)
        foot = (f"<tfoot><tr><td colspan='{len(self.header)}' style='text-align:left'><small>{note}</small>"
                f"</td></tr></tfoot>" if self.note else "")
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody>{foot}</table>"


def table(rows, header, title: str = "", note: str = "", link: str = "") -> Table:
    """Build a Table; floats are shown with 4 significant digits."""
    if isinstance(header, str) or not isinstance(header, (list, tuple)) or not header:
        raise TypeError(f"header must be a list of column names, got {header!r}")
    rows = [tuple(r) for r in rows]
    ragged = [i for i, r in enumerate(rows) if len(r) != len(header)]
    if ragged:
        raise ValueError(f"rows {ragged} do not have {len(header)} cells (one per column of the header): "
                         "give every row one value per column")
    return Table(tuple(header), tuple(tuple(_cell(v) for v in row) for row in rows), title, note, link)


# ---------------------------------------------------------------- the article's claims

CLOSE = 0.10    # a number holds when it is within 10 % of the article's ...
ROUGH = 2.0     # ... is a detail that does not hold within a factor of 2, and contradicts the claim beyond it


def ratio(measured: float, said: float) -> float:
    """How far apart a measured number and the article's are, as a factor ≥ 1 (inf when we measured 0)."""
    if measured < 0 or said <= 0:
        raise ValueError(f"a number's verdict compares positive quantities (the article's > 0, ours ≥ 0), "
                         f"got measured={measured}, said={said}")
    return math.inf if measured == 0 else max(measured, said) / min(measured, said)


class Verdict(str, Enum):
    """How one measurement answers one claim of the article. The only rule set: every claim's verdict comes from
    `Verdict.of` (a claim's point, its details and its numbers) or `Verdict.of_number` (a claim that is a number);
    `verdict_rules()` prints it, under the first claims table a learner meets (notebook 01's)."""

    HOLDS = "✓ holds"                        # the values are the English labels; code compares members and
    ROUGHLY = "≈ roughly"                     # str() shows the label of the current language (llmwalk.i18n)
    DIFFERS = "✗ differs"
    UNCHECKABLE = "— not checkable here"

    def __str__(self) -> str:
        return {Verdict.HOLDS: t("report.verdict.holds"), Verdict.ROUGHLY: t("report.verdict.roughly"),
                Verdict.DIFFERS: t("report.verdict.differs"),
                Verdict.UNCHECKABLE: t("report.verdict.uncheckable")}[self]

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    @classmethod
    def of(cls, point: bool, details: bool = True, *, numbers: Iterable[tuple[float, float]] = ()) -> "Verdict":
        """✓ when the claim's point and every detail hold; ≈ when the point holds and a detail (a name, a part of a
        list, a count) does not or is not measured; ✗ when the measurement contradicts the point. `numbers`: the
        claim's (measured, article's) pairs — within CLOSE (10 %) a number holds, within a factor ROUGH (2) it is a
        detail that does not, beyond ROUGH it contradicts the claim."""
        factors = [ratio(m, s) for m, s in numbers]
        if not point or any(f > ROUGH for f in factors):
            return cls.DIFFERS
        return cls.HOLDS if details and all(f <= 1 + CLOSE for f in factors) else cls.ROUGHLY

    @classmethod
    def of_number(cls, measured: float, said: float) -> "Verdict":
        """A claim that is a number: ✓ within CLOSE (10 %) of the article's, ≈ within a factor of ROUGH (2), ✗ beyond."""
        return cls.of(True, numbers=[(measured, said)])


def verdict_rules() -> str:
    """The verdict rules in the current language, as printed under the first claims table (notebook 01's)."""
    return t("report.rules", holds=Verdict.HOLDS, roughly=Verdict.ROUGHLY, differs=Verdict.DIFFERS,
             uncheckable=Verdict.UNCHECKABLE, close=f"{CLOSE:.0%}", rough=f"{ROUGH:g}")


SECTION_NOTEBOOKS = {"一": "01_one_second.ipynb", "二": "02_tokenization.ipynb", "三": "03_embedding.ipynb",
                     "四": "04_layers.ipynb", "五": "05_lm_head.ipynb", "六": "06_sampling.ipynb",
                     "七": "07_autoregressive.ipynb", "八": "08_cost.ipynb", "九": "09_the_journey.ipynb"}
FIRST_SECTION = "一"        # the rules are printed under this section's table, the first a learner meets


@dataclass(frozen=True)
class Claim:
    """One claim of the article next to what we measured.

    `numbers` holds the measured values the `measured` text is formatted from and the verdict is derived from
    (tests check these, not the prose); `said` the article's own number when the claim is one; `key` the claim's
    entry in strings/<lang>/claims.toml ("layers.knowledge"), which names the claim in tests.
    """

    section: str
    article: str
    measured: str
    verdict: Verdict
    numbers: dict = field(default_factory=dict, compare=False)
    said: float | None = None
    key: str = ""

    def __post_init__(self):
        if not isinstance(self.verdict, Verdict):
            raise TypeError(f"Claim.verdict must be a Verdict (Verdict.of / Verdict.of_number), got {self.verdict!r}")


def rules_note(first: bool) -> tuple[str, str]:
    """The line under a claims table and where it links: the rules themselves under the first table, elsewhere a
    pointer to them (say each thing once)."""
    if first:
        return verdict_rules(), ""
    return t("report.rules_elsewhere", notebook=SECTION_NOTEBOOKS[FIRST_SECTION]), SECTION_NOTEBOOKS[FIRST_SECTION]


def claims_table(claims: list[Claim], title: str | None = None, rules: bool | None = None) -> Table:
    """The closing table of each notebook (title None: "The article says / we measured" in the current language).

    Under it, the verdict rules when it is the first table a learner meets (section 一's, or rules=True), a link to
    them otherwise; rules=False: no line."""
    first = any(c.section == FIRST_SECTION for c in claims) if rules is None else rules
    note, link = rules_note(first) if rules is not False else ("", "")
    return table([(c.section, c.article, c.measured, str(c.verdict)) for c in claims],
                 ("§", t("report.claims.article"), t("report.claims.measured"), t("report.claims.verdict")),
                 t("report.claims.title") if title is None else title, note=note, link=link)


@dataclass(frozen=True)
class Tables:
    """Several tables shown one after the other (notebook 09: the claims, one table per section)."""

    tables: tuple[Table, ...]
    links: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return "\n\n".join(repr(table) for table in self.tables)

    def _repr_html_(self) -> str:
        parts = []
        for i, table in enumerate(self.tables):
            link = self.links[i] if i < len(self.links) else ""
            parts.append((f"<p><a href='{html.escape(link)}'>{html.escape(link)}</a></p>" if link else "")
                         + table._repr_html_())
        return "".join(parts)


def claims_by_section(claims: list[Claim]) -> Tables:
    """One claims table per section of the article, each titled with (and linking to) the notebook that measures it;
    the verdict rules once, under the first."""
    sections = list(dict.fromkeys(c.section for c in claims))
    groups = {s: [c for c in claims if c.section == s] for s in sections}
    titles = {s: t("report.claims.section_one", section=s, notebook=SECTION_NOTEBOOKS.get(s, "?")) if len(group) == 1
              else t("report.claims.section_many", section=s, n=len(group), notebook=SECTION_NOTEBOOKS.get(s, "?"))
              for s, group in groups.items()}
    tables = tuple(claims_table(group, titles[s], rules=s == sections[0]) for s, group in groups.items())
    return Tables(tables, tuple(SECTION_NOTEBOOKS.get(s, "") for s in sections))
