"""llmwalk: walk one prompt through a real language model, stage by stage."""
from .embedding import apply_rope, position_embedding, rope_angles, token_embedding
from .i18n import language, quoted, set_language
from .head import lm_head, logit_lens, softmax
from .generation import Generation, Step, decoding_head, generate, generate_stream
from .journey import Journey, journey, timed_forward
from .kv_cache import KVCache, LayerCache, kv_cache_bytes
from .layers import attention, block_forward, causal_mask, ffn, layer_norm, linear, norm, rms_norm
from .models import (CacheNotWritableError, CorruptModelFileError, HubUnreachableError, Model, ModelNotInstalledError,
                     PickleCheckpointError, UnknownModelError, UnsupportedModelError, available_models, is_installed,
                     load_model)
from .report import Claim, claims_table, table
from .tokens import Tokenizer, UnsafeChatTemplateError, gpt2_tokenizer
from .walk import Trace, forward
from .weights import Block, Config, Linear, Norm, Weights, count_params, to_dtype

__version__ = "0.1.0"
from .sampling import (Sampler, apply_temperature, greedy, min_p_filter, probs_after, sample, surgery, top_k_filter,
                       top_p_filter)
from .cost import flops_by_stage, generation_flops, gpt2_config, llama7b_config, n_params, weight_bytes
from .quantize import dequantize_model, quantize_model, quantize_tensor, dequantize_tensor
from .speculative import EarlyExitDraft, ModelDraft, PromptLookupDraft, speculative_generate
from . import accuracy, claims, cost, generation, gguf_blocks, kv_cache, quantize, report, sampling, speculative   # noqa: E402  modules by section
