"""Sliders, text boxes and buttons bound to the plots: on every change a widget calls its plain plot function
(its twin: same arguments, returns the figure) and shows the new figure."""
from __future__ import annotations

import base64
import io
import time
from typing import Callable

import ipywidgets as W
import torch
from IPython.display import display
from matplotlib.figure import Figure
from torch import Tensor

from ..generate import Step
from ..sampling import probs_after, sample
from ..walk import forward
from .attention import attention_heatmap
from .generation import generation_table
from .lens import logit_lens_top
from .sampling import prob_bars, sampling_panel
from .tokens import token_chips_compare


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes, cropped as a notebook shows it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


class PlotWidget:
    """Controls bound to a plot: every change calls plot(**values) and shows the new `figure` in `output`."""

    def __init__(self, plot: Callable[..., Figure], controls: dict[str, W.Widget], below: tuple[W.Widget, ...] = ()):
        self.plot, self.controls = plot, controls
        self.output = W.Output()
        self.figure: Figure | None = None
        self._holding = False
        for control in self._value_controls().values():
            control.observe(self.redraw, names="value")
        self.box = W.VBox([W.HBox(list(controls.values()), layout=W.Layout(flex_flow="row wrap")), self.output,
                           *below])
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
        self.figure = self.plot(**self.values)
        data = {"image/png": base64.b64encode(png(self.figure)).decode(), "text/plain": repr(self.figure)}
        self.output.outputs = ({"output_type": "display_data", "data": data, "metadata": {}},)

    def _ipython_display_(self) -> None:
        display(self.box)


def _slider(value: float, lo: float, hi: float, step: float, description: str) -> W.SelectionSlider:
    """A slider over lo, lo + step, ..., hi: only these values can be set (no 1e-300 temperature)."""
    grid = [round(lo + i * step, 6) for i in range(round((hi - lo) / step) + 1)]
    return W.SelectionSlider(options=[(f"{v:g}", v) for v in grid], value=min(grid, key=lambda v: abs(v - value)),
                             description=description, continuous_update=False)


def sampling_widget(logits: Tensor, tokenizer, n: int = 10) -> PlotWidget:
    """Temperature, top-k, top-p and min-p sliders bound to sampling_panel (probability bars and surgery).  # [vocab]"""
    def plot(temperature, top_k, top_p, min_p):
        return sampling_panel(logits, tokenizer, temperature, top_k or None, top_p if top_p < 1 else None,
                              min_p or None, n)
    return PlotWidget(plot, {
        "temperature": _slider(1.0, 0.05, 2.0, 0.05, "temperature"),
        "top_k": W.IntSlider(value=0, min=0, max=50, description="top-k (0 off)", continuous_update=False),
        "top_p": _slider(1.0, 0.05, 1.0, 0.01, "top-p (1 off)"),
        "min_p": _slider(0.0, 0.0, 0.5, 0.01, "min-p (0 off)")})


def attention_widget(trace, tokenizer) -> PlotWidget:
    """Layer and head sliders bound to attention_heatmap."""
    n_layer, n_head = len(trace.layers), trace.layers[0].attn.weights.shape[0]
    return PlotWidget(lambda layer, head: attention_heatmap(trace, tokenizer, layer, head), {
        "layer": W.IntSlider(value=0, min=0, max=n_layer - 1, description="layer", continuous_update=False),
        "head": W.IntSlider(value=0, min=0, max=n_head - 1, description="head", continuous_update=False)})


def logit_lens_widget(trace, model, k: int = 5) -> PlotWidget:
    """A position slider bound to logit_lens_top."""
    t = len(trace.ids)
    return PlotWidget(lambda position: logit_lens_top(trace, model, position, k), {
        "position": W.IntSlider(value=t - 1, min=0, max=t - 1, description="position", continuous_update=False)})


def token_chips_widget(tokenizers: dict, text: str = "法国的首都是什么") -> PlotWidget:
    """A text box bound to token_chips_compare."""
    return PlotWidget(lambda text: token_chips_compare(text, tokenizers), {
        "text": W.Text(value=text, description="text", continuous_update=False, layout=W.Layout(width="60%"))})


class GenerationWidget(PlotWidget):
    """Generate one token per click of 'next token': the bars show the distribution the next click draws from."""

    def __init__(self, model, prompt: str, chat: bool = False, temperature: float = 0.7, seed: int = 0, n: int = 10):
        self.model, self.n = model, n
        self.prompt_ids = model.tokenizer.encode(prompt, chat=chat)
        self.eos = set(model.config.eos_token_ids) | set(model.tokenizer.eos_token_ids)
        self.table = W.HTML()
        controls = {"temperature": _slider(temperature, 0.0, 2.0, 0.05, "temperature"),
                    "seed": W.IntText(value=seed, description="seed"),
                    "next": W.Button(description="next token", button_style="primary"),
                    "reset": W.Button(description="reset")}
        controls["seed"].observe(self._restart, names="value")      # before redraw: a new seed starts over
        controls["next"].on_click(lambda _: self.next())
        controls["reset"].on_click(lambda _: self.reset())
        self.controls, self.steps = controls, []
        self.prompt_run = self._run()             # reset and a new seed start from here without rerunning the model
        self._restart()
        super().__init__(lambda temperature, seed: self._plot(temperature), controls, below=(self.table,))

    @property
    def ids(self) -> list[int]:
        """Prompt and generated tokens."""
        return self.prompt_ids + [s.token_id for s in self.steps]

    def _restart(self, change=None) -> None:
        """Back to the prompt, the generator re-seeded."""
        self.steps: list[Step] = []
        self.generator = torch.Generator().manual_seed(int(self.controls["seed"].value))
        self.logits, self.seconds = self.prompt_run

    def _run(self) -> tuple[Tensor, float]:
        """The model on the sequence so far: the next token's logits, and the seconds it took.  # -> [vocab]"""
        tic = time.perf_counter()
        return forward(self.model, self.ids, record=False, last_only=True).logits[0], time.perf_counter() - tic

    def next(self) -> None:
        """Draw the next token (seeded), append it, redraw."""
        if self.steps and self.steps[-1].token_id in self.eos:
            return
        tic, t = time.perf_counter(), self.controls["temperature"].value
        token = int(sample(self.logits, t, generator=self.generator))
        prob = float(probs_after(self.logits, t)[token])
        n = len(self.ids)                         # no KV cache: every round runs the whole sequence
        self.steps.append(Step(len(self.steps) + 1, n, n, token, self.model.tokenizer.pieces([token])[0], prob, (),
                               self.seconds + time.perf_counter() - tic))
        self.logits, self.seconds = self._run()
        self.redraw()

    def reset(self) -> None:
        """Back to the prompt, the generator re-seeded, and redraw."""
        self._restart()
        self.redraw()

    def _plot(self, temperature: float) -> Figure:
        self.table.value = generation_table(self.steps, self.model.tokenizer, self.prompt_ids)._repr_html_()
        self.controls["next"].disabled = bool(self.steps) and self.steps[-1].token_id in self.eos
        text = self.model.tokenizer.decode(self.ids)[-60:].replace("\n", "↵")
        return prob_bars(self.logits, self.model.tokenizer, temperature, n=self.n, title=f"…{text}")


def generation_widget(model, prompt: str, chat: bool = False, temperature: float = 0.7, seed: int = 0,
                      n: int = 10) -> GenerationWidget:
    """Step-through generation: 'next token' draws one token (seeded) and redraws the next distribution."""
    return GenerationWidget(model, prompt, chat, temperature, seed, n)
