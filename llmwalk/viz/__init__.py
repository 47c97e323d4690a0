"""Seeing the walk: a plot for every stage of the article, and widgets that redraw them as you move a control.

Every plot function returns a matplotlib Figure (made outside pyplot: a notebook shows it once, nothing to
close). The only part of llmwalk that imports matplotlib and ipywidgets.
"""
from . import _draw
from .attribution import direct_vs_total, logit_attribution_bars
from .attention import (attention_heads, attention_heatmap, attention_step, last_token_attention,
                        mask_and_attention, mask_plot)
from .cost import (error_histogram, flops_bars, memory_bars, pass_cost, speculative_timeline, stage_timeline,
                   time_per_token)
from .embedding import order_demo, position_table, rope_frequencies, similarity_matrix, vector_strips
from .fonts import use_cjk_font
from .generation import generation_figure, generation_table
from .journey import journey_diagram, pipeline_diagram
from .layers import (ablation_sweep, block_diagram, ffn_activations, ffn_widths, intervention_bars, norm_stats,
                     patching_heatmap, residual_norms)
from .lens import logit_lens_grid, logit_lens_top, token_rank
from .plot_widget import PlotWidget, png
from .sampling import prob_bars, sample_histogram, sampling_panel, surgery_plot
from .tokens import piece_labels, token_chips, token_chips_compare
from .widgets import (attention_step_widget, attention_widget, cost_widget, generation_widget, logit_lens_widget,
                      next_token_widget, sampling_widget, similarity_widget, token_chips_widget)

use_cjk_font()
_draw.show_figures_in_ipython()
