"""matplotlib, set up once for whywait's PNGs (replay and report timelines, the digest's bars, eval's plot).

Called by every module that draws, instead of importing ``matplotlib.pyplot`` itself: it selects the Agg
backend (no display on a server or in CI), gives the text a font fallback chain so a job or project named
in Chinese, Japanese or with an emoji is drawn where such fonts are installed (``DejaVu Sans`` alone drew
boxes), and keeps matplotlib's "Glyph N missing from font(s)" warnings out of the command's output (a
missing glyph is drawn as a box; the command's own lines are what its user reads). Imports matplotlib only
when called, so commands that draw nothing never load it.
"""

from __future__ import annotations

import warnings
from typing import Any

# Tried in order for each character; the ones not installed are skipped (fonts-noto-cjk, fonts-noto-color-emoji
# on Debian and Ubuntu).
FONT_FALLBACK = ["DejaVu Sans", "Noto Sans CJK JP", "Noto Sans CJK SC", "Noto Sans", "Noto Color Emoji",
                 "Noto Emoji", "Symbola"]
_READY = False


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend with whywait's font fallback; returns the module."""
    global _READY
    import matplotlib

    if not _READY:
        matplotlib.use("Agg")
        matplotlib.rcParams["font.family"] = "sans-serif"
        matplotlib.rcParams["font.sans-serif"] = FONT_FALLBACK + [
            f for f in matplotlib.rcParams["font.sans-serif"] if f not in FONT_FALLBACK]
        _READY = True
    # Every call (an identical filter replaces itself): a caller's catch_warnings() may have reset them.
    warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
    warnings.filterwarnings("ignore", message=r"findfont: Font family .* not found", category=UserWarning)
    import matplotlib.pyplot as plt

    return plt
