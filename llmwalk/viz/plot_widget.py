"""The render framework under every widget: `PlotWidget` binds controls to a plot and shows each new figure as one
PNG, fast enough to follow a slider (its own PNG writer, blitting of the artists an update changed, a layout kept
from the first draw, torch on one thread for the small sums of a redraw). The widgets themselves are in widgets.py."""
from __future__ import annotations

import base64
import io
import re
import struct
import warnings
import zlib
from contextlib import contextmanager
from typing import Callable, Iterator

import ipywidgets as W
import numpy as np
import torch
from IPython.display import display
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..i18n import t


def png(fig: Figure, crop: bool = True) -> bytes:
    """The figure as PNG bytes, cropped as a notebook shows it (crop=False: the figure's own size, one draw)."""
    if crop:                     # the crop measures every artist first: a second pass over the figure
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        return buf.getvalue()
    canvas = agg_canvas(fig)        # savefig would lay a kept layout out once more before drawing
    canvas.draw()
    return _encode(canvas)


def agg_canvas(fig: Figure) -> FigureCanvasAgg:
    """The figure's Agg canvas, made once: its renderer (and a background copied from it) lives as long."""
    return fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)


def _encode(canvas: FigureCanvasAgg) -> bytes:
    """The pixels the canvas holds as PNG bytes, for a figure that redraws on every move: RGB (opaque figures: a
    quarter less to write), rows unfiltered, fast deflate. Half the time of PIL's encoder, which filters every
    row first; for the same pixels (tests/test_viz.py decodes it)."""
    rgba = np.asarray(canvas.buffer_rgba())                     # (H, W, 4) uint8
    height, width = rgba.shape[:2]
    rows = np.zeros((height, 1 + 3 * width), np.uint8)          # each row: filter type 0 (none), then R G B ...
    rows[:, 1:] = rgba[:, :, :3].reshape(height, -1)
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)   # 8-bit RGB, deflate, no filter, no interlace
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 1))
            + chunk(b"IEND", b""))


def _blit(fig: Figure, artists: list, background=None) -> tuple[bytes, object]:
    """PNG bytes of `fig` with only `artists` drawn anew over `background` (the pixels of everything else, copied
    at the first call: ticks, labels, colorbar are drawn once). Returns the PNG and the background to pass next."""
    canvas = agg_canvas(fig)
    if background is None:
        for a in artists:
            a.set_animated(True)                 # left out of this one full draw ...
        canvas.draw()
        background = canvas.copy_from_bbox(fig.bbox)
        for a in artists:
            a.set_animated(False)                # ... and back in any later full draw (savefig, a test)
    else:
        canvas.restore_region(background)
    for a in sorted(artists, key=lambda a: a.get_zorder()):       # stable: the order a full draw has
        fig.draw_artist(a)
    return _encode(canvas), background


@contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread for the small sums of a redraw (one [vocab] row, one attention map): split over threads,
    each of those operations waits for a second thread to wake up, tens of ms on a busy machine for 50 µs of work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class PlotWidget:
    """Controls bound to a plot: every change calls plot(**values) and shows the new `figure` in `output`.

    With `update`, the figure is built once by plot(**values) and every later change calls update(figure,
    **values), which sets the existing artists (bar lengths, image data, texts) instead of building a new figure,
    and renders one PNG pass. With fixed_layout, the layout computed at the first draw is kept too (for updates
    that change no tick label's length). With blit (and fixed_layout), update returns the artists it changed and
    only they are drawn anew, over the pixels of the rest drawn once (a 150-token heatmap's tick labels cost more
    than its image). update runs with one torch thread (see one_thread).
    A ValueError or TypeError from the plot (input it cannot draw) is shown as a message instead of a figure:
    `figure` is then None and `error` holds the message (an exception escaping an observer is lost in the browser).
    """

    def __init__(self, plot: Callable[..., Figure], controls: dict[str, W.Widget], below: tuple[W.Widget, ...] = (),
                 update: Callable[..., None] | None = None, fixed_layout: bool = False, blit: bool = False):
        if blit and not (update and fixed_layout):
            raise ValueError("blit redraws some artists over a fixed picture: pass update and fixed_layout=True too")
        self.plot, self.update, self.fixed_layout, self.blit, self.controls = plot, update, fixed_layout, blit, controls
        self.output = W.Output()
        self.figure: Figure | None = None
        self.error: str | None = None
        self._holding = False
        self._background = None                  # blit: the pixels of what updates leave alone
        for control in self._value_controls().values():
            control.observe(self.redraw, names="value")
            if hasattr(control.style, "description_width"):
                control.style.description_width = "initial"      # the whole label ("temperature"), not "temperat…"
        self.box = W.VBox([W.HBox(list(controls.values()), layout=W.Layout(flex_flow="row wrap")), self.output,
                           *below])
        # The widget's text/plain, what a reader sees where widgets do not run (a notebook viewer, a terminal): one
        # sentence naming the controls in the notebook's language, not ipywidgets' repr of every child.
        names = [c.description for c in controls.values() if getattr(c, "description", "")]
        self.summary = t("viz.widgets.summary", controls=t("viz.widgets.separator").join(names))
        self.redraw()

    def _value_controls(self) -> dict[str, W.ValueWidget]:
        return {k: c for k, c in self.controls.items() if isinstance(c, W.ValueWidget)}

    @property
    def values(self) -> dict:
        """The current value of every control that has one."""
        return {k: c.value for k, c in self._value_controls().items()}

    def set(self, **values) -> None:
        """Set several controls, then redraw once."""
        self._holding = True
        try:
            for name, value in values.items():
                self.controls[name].value = value
        finally:
            self._holding = False
        self.redraw()

    def redraw(self, change=None) -> None:
        """Call the plot with the current values and show the figure (replacing the previous one)."""
        if self._holding:
            return
        try:
            _no_surrogates(self._value_controls())
            changed = None
            if self.update is not None and self.figure is not None:
                with one_thread():
                    changed = self.update(self.figure, **self.values)
            else:
                self.figure, self._background = self.plot(**self.values), None
            self.error = None
            with warnings.catch_warnings():           # typed text in a script no font has: boxes, not a warning
                warnings.filterwarnings("ignore", "Glyph .* missing from font")
                if self.blit and changed is not None:
                    image, self._background = _blit(self.figure, changed, self._background)
                else:
                    image = png(self.figure, crop=self.update is None)
            if self.fixed_layout:
                self.figure.set_layout_engine("none")     # laid out once at the first draw: keep those positions
        except (ValueError, TypeError) as e:  # bad input: say what to change, no traceback out of an observer
            self.figure, self.error = None, str(e)
            self.output.outputs = ({"output_type": "stream", "name": "stdout", "text": f"⚠ {e}\n"},)
            return
        data = {"image/png": base64.b64encode(image).decode(), "text/plain": repr(self.figure)}
        self.output.outputs = ({"output_type": "display_data", "data": data, "metadata": {}},)

    def _ipython_display_(self) -> None:
        display({**self.box._repr_mimebundle_(), "text/plain": self.summary}, raw=True)


def _no_surrogates(controls: dict[str, W.ValueWidget]) -> None:
    """A ValueError naming the fix for text holding half of a UTF-16 pair (pasted from a broken source): no
    tokenizer can encode it, and tokenizers' own TypeError says the text is not a str."""
    for control in controls.values():
        if isinstance(value := control.value, str) and (bad := re.search("[\ud800-\udfff]", value)):
            raise ValueError(t("viz.widgets.surrogate", name=control.description, char=ascii(bad.group()),
                               position=bad.start()))
