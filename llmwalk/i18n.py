"""The language of what llmwalk shows: figure titles, axis labels, legends, widget controls, table headers, the
claims tables and the exercises' messages. Code asks for a text by key; the texts of each language live in data
files, one per area: `llmwalk/strings/<language>/<area>.toml` (the key "viz.sampling.title" is `[sampling] title`
in `viz.toml`). Numbers, tokens and code stay as they are in every language.

    lw.set_language("zh")      # the Chinese edition's first cell; "en" in the English edition
"""
from __future__ import annotations

import string
from functools import cache
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:      # Python 3.10 (Ubuntu 22.04's): the same parser, from PyPI
    import tomli as tomllib

LANGUAGES = ("en", "zh")
STRINGS = Path(__file__).parent / "strings"
_current = "en"


def set_language(language: str) -> None:
    """Show every later figure, widget, table and message in `language` ("en" or "zh")."""
    global _current
    if language not in LANGUAGES:
        raise ValueError(f"set_language takes one of {', '.join(map(repr, LANGUAGES))}, got {language!r}")
    _current = language


def language() -> str:
    """The language llmwalk currently shows ("en" unless set_language changed it)."""
    return _current


def t(key: str, /, **fields) -> str:
    """The text for `key` ("area.name" or "area.group.name") in the current language, formatted with `fields`
    (`str.format` placeholders, e.g. t("viz.sampling.kept", n=47, total=49152))."""
    texts = table(_current)
    if key not in texts:
        raise KeyError(f"no text {key!r} in llmwalk/strings/{_current}/ — add it to "
                       f"{key.split('.')[0]}.toml of every language")
    text = texts[key]
    return text.format(**fields) if fields else text


def quoted(text: str) -> str:
    """A model's text or token inside a sentence: Python's repr in English ('Paris', with \\n and the like shown),
    the same inside Chinese quotes in Chinese (“巴黎”)."""
    r = repr(text)
    return r if _current == "en" else f"“{r[1:-1]}”"


@cache
def table(language: str) -> dict[str, str]:
    """Every text of `language`, by dotted key (tests compare the languages' keys and placeholders)."""
    texts: dict[str, str] = {}
    for path in sorted((STRINGS / language).glob("*.toml")):
        with path.open("rb") as f:
            _flatten(tomllib.load(f), path.stem, texts)
    return texts


def placeholders(text: str) -> set[str]:
    """The `{name}` fields a text formats (the same in every language)."""
    return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(text) if name}


def _flatten(node: dict, prefix: str, out: dict[str, str]) -> None:
    for name, value in node.items():
        key = f"{prefix}.{name}"
        if isinstance(value, dict):
            _flatten(value, key, out)
        elif isinstance(value, str):
            out[key] = value
        else:
            raise TypeError(f"llmwalk/strings: {key} must be a string, got {type(value).__name__}")
