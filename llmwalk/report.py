"""Small tables for notebooks: plain text for terminals and nbval, HTML for Jupyter. No pandas needed."""
from __future__ import annotations

import html
import unicodedata
from dataclasses import dataclass


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

    def __repr__(self) -> str:
        cells = [list(self.header)] + [list(r) for r in self.rows]
        widths = [max(_width(c) for row in cells for c in [row[i]]) for i in range(len(self.header))]
        fmt = lambda row: " | ".join(_pad(c, w) for c, w in zip(row, widths)).rstrip()   # noqa: E731
        lines = ([self.title] if self.title else []) + [fmt(cells[0]), "-+-".join("-" * w for w in widths)]
        return "\n".join(lines + [fmt(r) for r in cells[1:]])

    def _repr_html_(self) -> str:
        esc = lambda s: html.escape(s).replace("\n", "<br>")                                  # noqa: E731
        head = "".join(f"<th style='text-align:left'>{esc(h)}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{esc(c)}</td>" for c in r) + "</tr>"
                       for r in self.rows)
        caption = f"<caption style='text-align:left'><b>{esc(self.title)}</b></caption>" if self.title else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def table(rows, header, title: str = "") -> Table:
    """Build a Table; floats are shown with 4 significant digits."""
    return Table(tuple(header), tuple(tuple(_cell(v) for v in row) for row in rows), title)


@dataclass(frozen=True)
class Claim:
    """One claim of the article next to what we measured."""

    section: str
    article: str
    measured: str
    verdict: str      # "✓ holds", "✗ differs", "≈ roughly", "— not checkable here"


def claims_table(claims: list[Claim], title: str = "The article says / we measured") -> Table:
    """The closing table of each notebook."""
    return table([(c.section, c.article, c.measured, c.verdict) for c in claims],
                 ("§", "the article says", "we measured", "verdict"), title)
