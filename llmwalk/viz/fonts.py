"""Chinese text in figures: find an installed CJK font and let matplotlib fall back to it."""
from __future__ import annotations

import os
import sys
import warnings

from matplotlib import font_manager, rcParams

# Fonts with Simplified Chinese glyphs, most complete first (Linux, macOS, Windows).
CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans SC", "Noto Sans CJK JP", "Source Han Sans SC", "Source Han Sans CN",
             "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "PingFang SC", "Hiragino Sans GB", "Heiti SC", "STHeiti",
             "Microsoft YaHei", "SimHei", "Arial Unicode MS")

# File names of those fonts, to find one installed after matplotlib cached its font list.
CJK_FILES = ("wqy", "notosanscjk", "notosanssc", "sourcehansans", "pingfang", "hiragino", "heiti", "msyh", "simhei",
             "arialuni", "arial unicode")

INSTALL_HINT = {"linux": "sudo apt-get install fonts-wqy-microhei (or fonts-noto-cjk)",
                "darwin": "brew install --cask font-noto-sans-cjk-sc",
                "win32": "Settings > Time & language > Language: add 中文(简体) to get Microsoft YaHei"}

_warned = False


def use_cjk_font() -> str | None:
    """Make Chinese render as glyphs: Latin stays in the default font, CJK falls back to an installed font."""
    global _warned
    name = _installed_cjk_font()
    if name is None:
        for path in font_manager.findSystemFonts():             # installed since matplotlib built its cache?
            if any(key in os.path.basename(path).lower().replace("-", "") for key in CJK_FILES):
                font_manager.fontManager.addfont(path)
        name = _installed_cjk_font()
    if name is None:
        if not _warned:
            hint = INSTALL_HINT.get(sys.platform, INSTALL_HINT["linux"])
            warnings.warn(f"no CJK font found: Chinese text will show as empty boxes. Install one ({hint}) "
                          "and restart the kernel.", stacklevel=2)
            _warned = True
        return None
    rcParams["font.family"] = ["sans-serif", name]   # matplotlib >= 3.6 falls back glyph by glyph
    return name


def _installed_cjk_font() -> str | None:
    """The first font of CJK_FONTS that matplotlib knows."""
    installed = {f.name for f in font_manager.fontManager.ttflist}
    return next((n for n in CJK_FONTS if n in installed), None)
