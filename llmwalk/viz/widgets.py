"""Sliders, text boxes and buttons bound to the plots: on every change a widget calls its plain plot function
(its twin: same arguments, returns the figure) and shows the new figure (see plot_widget.py for how)."""
from __future__ import annotations

import re
import time
from dataclasses import replace

import ipywidgets as W
import torch
from matplotlib.figure import Figure
from torch import Tensor

from ..checks import is_int
from ..cost import decode_step_flops
from ..generation import Step, prepare
from ..i18n import t
from ..kv_cache import KVCache
from ..prompts import PROMPT, QUESTION
from ..sampling import Sampler
from ..walk import forward
from ._draw import show_piece
from .attention import attention_heatmap, attention_step, update_attention_heatmap, update_attention_step
from .cost import flops_bars
from .embedding import similarity_matrix
from .generation import generation_table
from .lens import logit_lens_top
from .plot_widget import PlotWidget, agg_canvas, one_thread
from .sampling import prob_bars, sampling_panel, update_prob_bars, update_sampling_panel
from .tokens import token_chips_compare


def _slider(value: float, lo: float, hi: float, step: float, description: str) -> W.SelectionSlider:
    """A slider over lo, lo + step, ..., hi: only these values can be set (no 1e-300 temperature)."""
    grid = [round(lo + i * step, 6) for i in range(round((hi - lo) / step) + 1)]
    return W.SelectionSlider(options=[(f"{v:g}", v) for v in grid], value=min(grid, key=lambda v: abs(v - value)),
                             description=description, continuous_update=False)


def sampling_widget(logits: Tensor, tokenizer, n: int = 10) -> PlotWidget:
    """Temperature, top-k, top-p and min-p sliders bound to sampling_panel (probability bars and surgery).  # [vocab]"""
    if not isinstance(logits, Tensor) or logits.dim() != 1:
        raise ValueError(f"sampling_widget takes one [vocab] row of logits, got shape "
                         f"{tuple(getattr(logits, 'shape', ()))}: pass one position's row, e.g. trace.logits[-1]")
    def settings(temperature, top_k, top_p, min_p) -> tuple:
        return temperature, top_k or None, top_p if top_p < 1 else None, min_p or None
    return PlotWidget(lambda **v: sampling_panel(logits, tokenizer, *settings(**v), n), {
        "temperature": _slider(1.0, 0.05, 2.0, 0.05, t("viz.widgets.temperature")),
        "top_k": W.IntSlider(value=0, min=0, max=50, description=t("viz.widgets.top_k"), continuous_update=False),
        "top_p": _slider(1.0, 0.05, 1.0, 0.01, t("viz.widgets.top_p")),
        "min_p": _slider(0.0, 0.0, 0.5, 0.01, t("viz.widgets.min_p"))},
        update=lambda fig, **v: update_sampling_panel(fig, logits, tokenizer, *settings(**v)), fixed_layout=True,
        blit=True)


def attention_widget(trace, tokenizer) -> PlotWidget:
    """Layer and head sliders bound to attention_heatmap, redrawn in place (image data and title)."""
    layers = trace._recorded("attn")                 # a record=False trace has none: say how to record one
    n_layer, n_head = len(layers), layers[0].attn.weights.shape[0]
    return PlotWidget(lambda layer, head: attention_heatmap(trace, tokenizer, layer, head), {
        "layer": W.IntSlider(value=0, min=0, max=n_layer - 1, description=t("viz.widgets.layer"),
                             continuous_update=False),
        "head": W.IntSlider(value=0, min=0, max=n_head - 1, description=t("viz.widgets.head"),
                            continuous_update=False)},
        update=lambda fig, layer, head: update_attention_heatmap(fig, trace, layer, head), fixed_layout=True,
        blit=True)


def attention_step_widget(trace, model) -> PlotWidget:
    """Layer, head and query-token controls bound to attention_step (its static twin), redrawn in place."""
    n_layer, n_head, n = len(trace._recorded("attn")), model.config.n_head, len(trace.ids)
    tokens = [(f"{i}: {show_piece(p)}", i) for i, p in enumerate(model.tokenizer.pieces(trace.ids))]
    return PlotWidget(lambda layer, head, query: attention_step(trace, model, layer, head, query), {
        "layer": W.IntSlider(value=0, min=0, max=n_layer - 1, description=t("viz.widgets.layer"),
                             continuous_update=False),
        "head": W.IntSlider(value=0, min=0, max=n_head - 1, description=t("viz.widgets.head"),
                            continuous_update=False),
        "query": W.Dropdown(options=tokens, value=n - 1, description=t("viz.widgets.query_token"))},
        update=lambda fig, layer, head, query: update_attention_step(fig, trace, model, layer, head, query),
        fixed_layout=True, blit=True)


MAX_LENS_K = 20           # columns of the lens grid: more do not fit the width of a notebook


def logit_lens_widget(trace, model, k: int = 5) -> PlotWidget:
    """A position slider bound to logit_lens_top, k (1 to MAX_LENS_K) columns."""
    if not is_int(k) or not 1 <= k <= MAX_LENS_K:
        raise ValueError(f"k (tokens shown per layer) must be an int in 1..{MAX_LENS_K}, got {k!r}: e.g. k=5")
    trace._recorded("resid")                          # the lens reads every layer's residual stream
    n = len(trace.ids)
    return PlotWidget(lambda position: logit_lens_top(trace, model, position, k), {
        "position": W.IntSlider(value=n - 1, min=0, max=n - 1, description=t("viz.widgets.position"),
                                continuous_update=False)})


def token_chips_widget(tokenizers: dict, text: str = QUESTION) -> PlotWidget:
    """A text box bound to token_chips_compare."""
    return PlotWidget(lambda text: token_chips_compare(text, tokenizers), {
        "text": W.Text(value=text, description=t("viz.widgets.text"), continuous_update=False,
                       layout=W.Layout(width="60%"))})


def _words(text: str, space: bool) -> list[str]:
    """Comma-separated words, each with a leading space (as in the middle of a sentence) if `space`."""
    words = [w.strip() for w in re.split("[,，、]", text)]          # Chinese commas too
    return [" " * space + w for w in words if w]


def _one_token(tokenizer, word: str) -> int:
    """The id of a word that is one token; a ValueError naming the fix if the tokenizer cuts it in pieces."""
    try:
        return tokenizer.token_id(word)
    except ValueError as e:
        raise ValueError(t("viz.widgets.one_token_space", error=e) if word.startswith(" ")
                         else t("viz.widgets.one_token", error=e)) from None


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
            raise ValueError(t("viz.widgets.two_words"))
        if len(chosen) > max_words:
            raise ValueError(t("viz.widgets.too_many_words", n=len(chosen), most=max_words))
        rows = [_one_token(model.tokenizer, w) for w in chosen]
        return similarity_matrix(model.weights.token_embd[rows], [_label(w) for w in chosen])
    return PlotWidget(plot, {
        "words": W.Text(value=words, description=t("viz.widgets.words"), continuous_update=False,
                        layout=W.Layout(width="60%")),
        "space": W.Checkbox(value=space, description=t("viz.widgets.leading_space"), indent=False)})


WIDGET_MAX_TOKENS = 2048    # a prompt typed into a widget: one forward pass of seconds on a laptop, not minutes


def next_token_widget(model, prompt: str = PROMPT, n: int = 10, chat: bool = False,
                      max_tokens: int = WIDGET_MAX_TOKENS) -> PlotWidget:
    """A prompt box (and a slider for how many bars) bound to prob_bars of the model's next-token distribution.

    With a chat template, a 'chat template' box wraps the prompt as a user message, as a chat app sends it. A
    prompt longer than `max_tokens` tokens gets a message, not a pass whose time grows with the square of its length.
    """
    last: dict = {}                                   # the last prompt's logits: moving the slider reruns nothing

    def plot(prompt, n, chat=False):
        if (prompt, chat) not in last:
            ids = model.tokenizer.encode(prompt, chat=chat)
            if not ids:
                raise ValueError(t("viz.widgets.empty_prompt"))
            if len(ids) > max_tokens:
                raise ValueError(t("viz.widgets.too_long", n=len(ids), most=max_tokens))
            last.clear()
            last[prompt, chat] = forward(model, ids, record=False, last_only=True).logits[-1]
        shown = _label(prompt if len(prompt) <= 50 else "…" + prompt[-49:])
        return prob_bars(last[prompt, chat], model.tokenizer, n=n,
                         title=t("viz.widgets.after_chat", prompt=shown) if chat
                         else t("viz.widgets.after", prompt=shown))
    controls = {"prompt": W.Text(value=prompt, description=t("viz.widgets.prompt"), continuous_update=False,
                                 layout=W.Layout(width="60%")),
                "n": W.IntSlider(value=n, min=1, max=30, description=t("viz.widgets.bars"), continuous_update=False)}
    if model.tokenizer.chat_template is not None:
        controls["chat"] = W.Checkbox(value=chat, description=t("viz.widgets.chat_template"), indent=False)
    return PlotWidget(plot, controls)


def cost_widget(configs: dict, context: int = 9, max_context: int = 4096) -> PlotWidget:
    """A model menu, a context-length slider and a KV-cache box bound to flops_bars of one new token's FLOPs.

    configs: {name: Config} (e.g. GPT-2 small, the loaded model, LLaMA-7B), counted from the architecture alone.
    """
    if not configs:
        raise ValueError("cost_widget needs at least one model: pass {name: Config}, e.g. {'SmolLM2': model.config}")
    if not is_int(max_context) or max_context < 1:
        raise ValueError(f"max_context must be an int >= 1, got {max_context!r}: e.g. max_context=4096")
    def plot(name, context, kv_cache):
        stages = decode_step_flops(configs[name], context, kv_cache=kv_cache)
        return flops_bars(stages, t("viz.cost.widget_title", name=name, context=context) if kv_cache
                          else t("viz.cost.widget_title_no_cache", name=name, context=context))
    return PlotWidget(plot, {
        "name": W.Dropdown(options=list(configs), description=t("viz.widgets.model")),
        "context": W.IntSlider(value=context, min=1, max=max_context, description=t("viz.widgets.context_length"),
                               continuous_update=False),
        "kv_cache": W.Checkbox(value=True, description=t("viz.widgets.kv_cache"), indent=False)})


class GenerationWidget(PlotWidget):
    """Generate one token per click of 'next token': the bars show the distribution the next click draws from.

    Each click is one round of generation's own loop (Loop.next_logits, then Loop.choose with the slider's
    temperature). The loop keeps a KV cache, so a round runs only the token drawn last (the answer is the one a
    rerun of the whole sequence gives, notebook 07), for up to `MAX_CLICKS` tokens. The bars are blitted over the
    first round's layout, laid out again only when a round's token names need more room.
    """

    MAX_CLICKS = 256          # the cache's room for new tokens (a few MB), allocated once

    def __init__(self, model, prompt: str, chat: bool = False, temperature: float = 0.7, seed: int = 0, n: int = 10,
                 *, top_p: float | None = None):
        self.model, self.n, self.top_p = model, n, top_p
        loop = prepare(model, prompt, max_new_tokens=1, temperature=temperature, top_p=top_p, seed=seed,
                       kv_cache=False, chat=chat, top_n=0)        # every setting checked before any widget
        clicks = min(self.MAX_CLICKS, model.config.context_length - len(loop.prompt_ids))
        self.loop = replace(loop, max_new_tokens=clicks,
                            cache=KVCache.empty(model.config, len(loop.prompt_ids) + clicks))
        self.prompt_ids = self.loop.prompt_ids
        self.eos = self.loop.eos_ids
        self.table = W.HTML()
        controls = {"temperature": _slider(temperature, 0.0, 2.0, 0.05, t("viz.widgets.temperature")),
                    "seed": W.IntText(value=seed, description=t("viz.widgets.seed")),
                    "next": W.Button(description=t("viz.widgets.next_token"), button_style="primary"),
                    "reset": W.Button(description=t("viz.widgets.reset"))}
        controls["seed"].observe(self._restart, names="value")      # before redraw: a new seed starts over
        controls["next"].on_click(lambda _: self.next())
        controls["reset"].on_click(lambda _: self.reset())
        self.controls, self.steps = controls, []
        self.prompt_run = self._run()             # reset and a new seed start from here without rerunning the model
        self._restart()
        super().__init__(lambda temperature, seed: self._plot(temperature), controls, below=(self.table,),
                         update=lambda figure, temperature, seed: self._plot(temperature, figure), fixed_layout=True,
                         blit=True)

    @property
    def ids(self) -> list[int]:
        """Prompt and generated tokens."""
        return self.prompt_ids + [s.token_id for s in self.steps]

    def _seed_error(self) -> str | None:
        """The message for a seed torch cannot take (the box takes any int), or None."""
        seed = self.controls["seed"].value
        return None if -2**63 <= seed < 2**64 else t("viz.widgets.seed_range", seed=seed)

    def _restart(self, change=None) -> None:
        """Back to the prompt, the generator re-seeded (a bad seed keeps the old one; the redraw says why)."""
        self.steps: list[Step] = []
        if self._seed_error() is None:
            self.generator = torch.Generator().manual_seed(self.controls["seed"].value)
        self.logits, self.seconds = self.prompt_run
        if self.loop.cache.length > len(self.prompt_ids):      # forget the drawn tokens' keys and values
            self.loop.cache.truncate(len(self.prompt_ids))

    def _run(self) -> tuple[Tensor, float]:
        """The loop's model pass on what is not cached yet: the next token's logits, and the seconds it took.
        # [vocab]"""
        tic = time.perf_counter()
        self.input_len, logits = self.loop.next_logits(self.ids)
        return logits, time.perf_counter() - tic

    @property
    def finished(self) -> bool:
        """The end token was drawn, or the cache is full."""
        return bool(self.steps) and (self.steps[-1].token_id in self.eos or len(self.steps) >= self.loop.max_new_tokens)

    def next(self) -> None:
        """Draw the next token (seeded) with the slider's temperature, append it, redraw."""
        if self.finished:
            return
        if self._seed_error():                                      # draw nothing: the redraw shows the message
            return self.redraw()
        sampler = Sampler(self.controls["temperature"].value, top_p=self.top_p)
        loop = replace(self.loop, sampler=sampler, generator=self.generator)
        started = time.perf_counter() - self.seconds                # the round began with its model pass
        with one_thread():                                          # one row of logits: see one_thread
            self.steps.append(loop.choose(len(self.steps) + 1, self.ids, self.input_len, self.logits, started))
        self.logits, self.seconds = self._run()
        self.redraw()

    def reset(self) -> None:
        """Back to the prompt, the generator re-seeded, and redraw."""
        self._restart()
        self.redraw()

    def _plot(self, temperature: float, figure: Figure | None = None) -> Figure | list:
        """The table and the next distribution's bars: a new figure, or `figure` redrawn in place (then the artists
        it changed, for the blit)."""
        if error := self._seed_error():
            raise ValueError(error)
        self.table.value = generation_table(self.steps, self.model.tokenizer, self.prompt_ids)._repr_html_()
        self.controls["next"].disabled = self.finished
        title = "…" + self.model.tokenizer.decode(self.ids)[-60:].replace("\n", "↵")
        if figure is None:
            figure = prob_bars(self.logits, self.model.tokenizer, temperature, top_p=self.top_p, n=self.n, title=title)
            self._layout = figure.get_layout_engine()      # the widget keeps its first layout: kept for a relayout
            return figure
        changed = update_prob_bars(figure, self.logits, self.model.tokenizer, temperature, top_p=self.top_p,
                                   title=title)
        # The kept layout left room for the first round's token names; a longer one would be cut at the figure's
        # edge: lay the figure out again (a full draw, a new background) for it.
        if figure.axes[0].yaxis.get_tightbbox(agg_canvas(figure).get_renderer()).x0 < 0:
            figure.set_layout_engine(self._layout)
            self._background = None
        return changed


def generation_widget(model, prompt: str, chat: bool = False, temperature: float = 0.7, seed: int = 0,
                      n: int = 10, *, top_p: float | None = None) -> GenerationWidget:
    """Step-through generation: 'next token' draws one token (seeded, top-p cut if given) and redraws the next
    distribution."""
    return GenerationWidget(model, prompt, chat, temperature, seed, n, top_p=top_p)
