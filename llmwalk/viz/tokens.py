"""Section 二: a text cut into tokens, one coloured chip per token with its id."""
from __future__ import annotations

from matplotlib.figure import Figure

from ..i18n import t
from ._draw import CHIP_COLORS, Chip, chip_figure, show_piece


def chips(tokenizer, ids) -> list[Chip]:
    """One chip per token: its piece (\\xNN for a fragment of a character, with a grey edge) and its id. The fragments
    that spell one character share a colour, so 法 = \\xe6\\xb3 + \\x95 shows as one colour over two chips."""
    ids = [int(i) for i in ids]
    colors, group, last = [], -1, None
    for n, spelled in enumerate(_spelled(tokenizer, ids)):
        first = spelled[3] if spelled else n          # a character's fragments: the colour of its first token
        if first != last:
            group, last = group + 1, first
        colors.append(CHIP_COLORS[group % len(CHIP_COLORS)])
    return [Chip(piece, str(i), color, "#888" if tokenizer.is_fragment(i) else "none")
            for i, piece, color in zip(ids, tokenizer.pieces(ids), colors)]


def token_chips(text: str, tokenizer, chat: bool = False) -> Figure:
    """The tokens of `text`: one coloured box per token, its id under it."""
    return token_chips_compare(text, {tokenizer.name: tokenizer}, chat)


MAX_CHIPS = 100           # chips drawn per row: each costs a box and two texts, about 10 ms a chip to draw


def token_chips_compare(text: str, tokenizers: dict, chat: bool = False, *, max_tokens: int = MAX_CHIPS) -> Figure:
    """The same text cut by several tokenizers, one row each, with the token count. A row draws its first
    max_tokens chips (a pasted article would take minutes and a tens-of-MB image); a note below says so."""
    rows, longest = [], 0
    for name, tokenizer in tokenizers.items():
        ids = tokenizer.encode(text, chat=chat)
        longest = max(longest, len(ids))
        rows.append((t("viz.tokens.row", name=name, n=len(ids)), chips(tokenizer, ids[:max_tokens])))
    note = t("viz.tokens.cut", shown=max_tokens, n=longest) if longest > max_tokens else None
    return chip_figure(rows, note=note)


def piece_labels(tokenizer, ids) -> list[str]:
    """A readable label per token: its text, or for a byte fragment the character it is part of and which piece,
    咬[1/3] (the first of the three tokens that spell 咬). A token with pieces of two characters keeps its \\xNN form."""
    ids = [int(i) for i in ids]
    return [f"{s[0]}[{s[1]}/{s[2]}]" if s else show_piece(tokenizer.pieces([i])[0])
            for i, s in zip(ids, _spelled(tokenizer, ids))]


def _spelled(tokenizer, ids: list[int]) -> list[tuple[str, int, int, int] | None]:
    """Per token: (character, k, n, index of its first token) when it is the k-th of the n tokens that spell one
    character between them, else None (whole characters, or bytes that spell none)."""
    spans, start = [], 0                                          # the byte range of every token
    for i in ids:
        n = len(tokenizer.token_bytes(i))
        spans.append((start, start + n))
        start += n
    chars, c = [], 0                                              # (start, end, character) of every character
    for ch in tokenizer.token_bytes_of(ids).decode("utf-8", errors="replace"):
        n = len(ch.encode("utf-8")) if ch != "\ufffd" else 1
        chars.append((c, c + n, ch))
        c += n
    out = []
    for s, e in spans:
        inside = [ch for ch in chars if ch[0] <= s and e <= ch[1] and (ch[0], ch[1]) != (s, e)]
        if not inside or inside[0][2] == "\ufffd":
            out.append(None)
            continue
        cs, ce, ch = inside[0]
        parts = [k for k, (ps, pe) in enumerate(spans) if ps < ce and cs < pe]
        out.append((ch, parts.index(len(out)) + 1, len(parts), parts[0]))
    return out
