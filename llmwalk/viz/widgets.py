"""Sliders, text boxes and buttons bound to the plots: on every change a widget calls its plain plot function
(its twin: same arguments, returns the figure) and shows the new figure."""
from __future__ import annotations

import base64
import io
import re
import time
import warnings
from typing import Callable

import ipywidgets as W
import torch
from IPython.display import display
from matplotlib.figure import Figure
from torch import Tensor

from ..cost import decode_step_flops
from ..generation import Step
from ..sampling import probs_after, sample
from ..walk import forward
from .attention import attention_heatmap
from .cost import flops_bars
from .embedding import similarity_matrix
from .generation import generation_table
from .lens import logit_lens_top
from .sampling import prob_bars, sampling_panel, update_prob_bars, update_sampling_panel
from .tokens import token_chips_compare


def png(fig: Figure, crop: bool = True) -> bytes:
    """The figure as PNG bytes, cropped as a notebook shows it (crop=False: the figure's own size, one draw)."""
    buf = io.BytesIO()
    if crop:                     # the crop measures every artist first: a second pass over the figure
        fig.savefig(buf, format="png", bbox_inches="tight")
    else:                        # a figure that redraws on every slider move: one pass, fast compression
        fig.savefig(buf, format="png", pil_kwargs={"compress_level": 1})
    return buf.getvalue()


class PlotWidget:
    """Controls bound to a plot: every change calls plot(**values) and shows the new `figure` in `output`.

    With `update`, the figure is built once by plot(**values) and every later change calls update(figure,
    **values), which sets the existing artists (bar lengths, image data, texts) instead of building a new figure,
    and renders one PNG pass. With fixed_layout, the layout computed at the first draw is kept too (for updates
    that change no tick label's length).
    A ValueError from the plot (input it cannot draw) is shown as a message instead of a figure: `figure` is then
    None and `error` holds the message.
    """

    def __init__(self, plot: Callable[..., Figure], controls: dict[str, W.Widget], below: tuple[W.Widget, ...] = (),
                 update: Callable[..., None] | None = None, fixed_layout: bool = False):
        self.plot, self.update, self.fixed_layout, self.controls = plot, update, fixed_layout, controls
        self.output = W.Output()
        self.figure: Figure | None = None
        self.error: str | None = None
        self._holding = False
        for control in self._value_controls().values():
            control.observe(self.redraw, names="value")
            if hasattr(control.style, "description_width"):
                control.style.description_width = "initial"      # the whole label ("temperature"), not "temperat…"
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
        try:
            if self.update is not None and self.figure is not None:
                self.update(self.figure, **self.values)
            else:
                self.figure = self.plot(**self.values)
            self.error = None
            with warnings.catch_warnings():           # typed text in a script no font has: boxes, not a warning
                warnings.filterwarnings("ignore", "Glyph .* missing from font")
                image = png(self.figure, crop=self.update is None)
            if self.fixed_layout:
                self.figure.set_layout_engine("none")     # laid out once at the first draw: keep those positions
        except ValueError as e:               # bad input: say what to change, no traceback
            self.figure, self.error = None, str(e)
            self.output.outputs = ({"output_type": "stream", "name": "stdout", "text": f"⚠ {e}\n"},)
            return
        data = {"image/png": base64.b64encode(image).decode(), "text/plain": repr(self.figure)}
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
    def settings(temperature, top_k, top_p, min_p) -> tuple:
        return temperature, top_k or None, top_p if top_p < 1 else None, min_p or None
    return PlotWidget(lambda **v: sampling_panel(logits, tokenizer, *settings(**v), n), {
        "temperature": _slider(1.0, 0.05, 2.0, 0.05, "temperature"),
        "top_k": W.IntSlider(value=0, min=0, max=50, description="top-k (0 off)", continuous_update=False),
        "top_p": _slider(1.0, 0.05, 1.0, 0.01, "top-p (1 off)"),
        "min_p": _slider(0.0, 0.0, 0.5, 0.01, "min-p (0 off)")},
        update=lambda fig, **v: update_sampling_panel(fig, logits, tokenizer, *settings(**v)), fixed_layout=True)


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


def _words(text: str, space: bool) -> list[str]:
    """Comma-separated words, each with a leading space (as in the middle of a sentence) if `space`."""
    words = [w.strip() for w in re.split("[,，、]", text)]          # Chinese commas too
    return [" " * space + w for w in words if w]


def _one_token(tokenizer, word: str) -> int:
    """The id of a word that is one token; a ValueError naming the fix if the tokenizer cuts it in pieces."""
    try:
        return tokenizer.token_id(word)
    except ValueError as e:
        raise ValueError(f"{e}. The table has one row per token: remove the word or type one that is one token"
                         + (", or untick 'leading space' (a word that starts a text, and Chinese, usually has none)"
                            if word.startswith(" ") else "")) from None


def _label(word: str) -> str:
    """repr(word) as a tick label: two $ would start mathtext."""
    label = repr(word)
    return label.replace("$", r"\$") if label.count("$") >= 2 else label


def similarity_widget(model, words: str = "Paris, London, France, Germany, king, queen, dog, cat",
                      space: bool = True, max_words: int = 20) -> PlotWidget:
    """A text box of comma-separated words bound to similarity_matrix of their rows of the token embedding table.

    Each word must be one token of the model's vocabulary; a word cut in pieces gets a message, not a figure.
    """
    def plot(words, space):
        chosen = _words(words, space)
        if len(chosen) < 2:
            raise ValueError("type at least two words, separated by commas (e.g. Paris, London, dog)")
        if len(chosen) > max_words:
            raise ValueError(f"{len(chosen)} words: type at most {max_words}")
        rows = [_one_token(model.tokenizer, w) for w in chosen]
        return similarity_matrix(model.weights.token_embd[rows], [_label(w) for w in chosen])
    return PlotWidget(plot, {
        "words": W.Text(value=words, description="words", continuous_update=False, layout=W.Layout(width="60%")),
        "space": W.Checkbox(value=space, description="leading space", indent=False)})


def next_token_widget(model, prompt: str = "The capital of France is", n: int = 10, chat: bool = False) -> PlotWidget:
    """A prompt box (and a slider for how many bars) bound to prob_bars of the model's next-token distribution.

    With a chat template, a 'chat template' box wraps the prompt as a user message, as a chat app sends it.
    """
    last: dict = {}                                   # the last prompt's logits: moving the slider reruns nothing

    def plot(prompt, n, chat=False):
        if (prompt, chat) not in last:
            ids = model.tokenizer.encode(prompt, chat=chat)
            if not ids:
                raise ValueError("the prompt is empty: type some text, the model predicts the token after it")
            last.clear()
            last[prompt, chat] = forward(model, ids, record=False, last_only=True).logits[-1]
        shown = _label(prompt if len(prompt) <= 50 else "…" + prompt[-49:])
        return prob_bars(last[prompt, chat], model.tokenizer, n=n,
                         title=f"after {shown}" + (" (chat template)" if chat else ""))
    controls = {"prompt": W.Text(value=prompt, description="prompt", continuous_update=False,
                                 layout=W.Layout(width="60%")),
                "n": W.IntSlider(value=n, min=1, max=30, description="bars", continuous_update=False)}
    if model.tokenizer.chat_template is not None:
        controls["chat"] = W.Checkbox(value=chat, description="chat template", indent=False)
    return PlotWidget(plot, controls)


def cost_widget(configs: dict, context: int = 9, max_context: int = 4096) -> PlotWidget:
    """A model menu, a context-length slider and a KV-cache box bound to flops_bars of one new token's FLOPs.

    configs: {name: Config} (e.g. GPT-2 small, the loaded model, LLaMA-7B), counted from the architecture alone.
    """
    def plot(name, context, kv_cache):
        stages = decode_step_flops(configs[name], context, kv_cache=kv_cache)
        return flops_bars(stages, f"{name}, one token at context {context}, " + ("KV cache" if kv_cache else "no cache"))
    return PlotWidget(plot, {
        "name": W.Dropdown(options=list(configs), description="model"),
        "context": W.IntSlider(value=context, min=1, max=max_context, description="context length",
                               continuous_update=False),
        "kv_cache": W.Checkbox(value=True, description="KV cache", indent=False)})


class GenerationWidget(PlotWidget):
    """Generate one token per click of 'next token': the bars show the distribution the next click draws from."""

    def __init__(self, model, prompt: str, chat: bool = False, temperature: float = 0.7, seed: int = 0, n: int = 10):
        self.model, self.n = model, n
        self.prompt_ids = model.tokenizer.encode(prompt, chat=chat)
        self.eos = model.eos_ids
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
        super().__init__(lambda temperature, seed: self._plot(temperature), controls, below=(self.table,),
                         update=lambda figure, temperature, seed: self._plot(temperature, figure))

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

    def _plot(self, temperature: float, figure: Figure | None = None) -> Figure:
        """The table and the next distribution's bars: a new figure, or `figure` redrawn in place."""
        self.table.value = generation_table(self.steps, self.model.tokenizer, self.prompt_ids)._repr_html_()
        self.controls["next"].disabled = bool(self.steps) and self.steps[-1].token_id in self.eos
        title = "…" + self.model.tokenizer.decode(self.ids)[-60:].replace("\n", "↵")
        if figure is None:
            return prob_bars(self.logits, self.model.tokenizer, temperature, n=self.n, title=title)
        update_prob_bars(figure, self.logits, self.model.tokenizer, temperature, title=title)
        return figure


def generation_widget(model, prompt: str, chat: bool = False, temperature: float = 0.7, seed: int = 0,
                      n: int = 10) -> GenerationWidget:
    """Step-through generation: 'next token' draws one token (seeded) and redraws the next distribution."""
    return GenerationWidget(model, prompt, chat, temperature, seed, n)
