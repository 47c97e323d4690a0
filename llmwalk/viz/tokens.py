"""Section 二: a text cut into tokens, one coloured chip per token with its id."""
from __future__ import annotations

from matplotlib.figure import Figure

from ._draw import CHIP_COLORS, Chip, chip_figure


def chips(tokenizer, ids) -> list[Chip]:
    """One chip per token: its piece (\\xNN for a fragment of a character, with a grey edge) and its id."""
    return [Chip(piece, str(i), CHIP_COLORS[n % len(CHIP_COLORS)], "#888" if tokenizer.is_fragment(int(i)) else "none")
            for n, (i, piece) in enumerate(zip(ids, tokenizer.pieces(ids)))]


def token_chips(text: str, tokenizer, chat: bool = False) -> Figure:
    """The tokens of `text`: one coloured box per token, its id under it."""
    return token_chips_compare(text, {tokenizer.name: tokenizer}, chat)


def token_chips_compare(text: str, tokenizers: dict, chat: bool = False) -> Figure:
    """The same text cut by several tokenizers, one row each, with the token count."""
    rows = []
    for name, tokenizer in tokenizers.items():
        ids = tokenizer.encode(text, chat=chat)
        rows.append((f"{name}\n{len(ids)} tokens", chips(tokenizer, ids)))
    return chip_figure(rows)
