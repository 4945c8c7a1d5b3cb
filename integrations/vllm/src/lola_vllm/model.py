"""LoLA Llama for vLLM: the Llama model with LoLA attention layers, and its config checks."""

from vllm.logger import init_logger
from vllm.model_executor.layers.mamba.mamba_utils import get_temporal_copy_spec
from vllm.model_executor.models.config import VerifyAndUpdateConfig
from vllm.model_executor.models.interfaces import HasInnerState, IsAttentionFree, SupportsMambaPrefixCaching
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM

from lola_vllm.layer import LoLALlamaAttention

logger = init_logger(__name__)


class LoLAModelConfig(VerifyAndUpdateConfig):
    """Refuse what a constant-size state cannot do; one state page per sequence, or, with
    prefix caching, vLLM's Mamba ``align`` mode: the running state copied forward into a new
    page at block boundaries, the page it leaves cached (about two live pages per request)."""

    @classmethod
    def verify_and_update_config(cls, vllm_config) -> None:
        cache = vllm_config.cache_config
        from lola.pretrained.resolve import resolve_config

        hf_config = vllm_config.model_config.hf_config
        context = getattr(hf_config, "max_position_embeddings", None)
        max_len = vllm_config.model_config.max_model_len
        from lola.integrations.transformers.export import check_vllm_schedule

        lola_config = resolve_config(getattr(hf_config, "lola", None))
        check_vllm_schedule(lola_config)
        if lola_config.positions != "bounded" and isinstance(context, int) and max_len > context:
            raise ValueError(
                f"max_model_len {max_len} is past the model's {context} positions, which LoLA with absolute positions cannot read: "
                "serve a config with positions='bounded' (lola export --vllm writes one from it) or max_model_len <= "
                f"{context}"
            )
        if vllm_config.speculative_config is not None:
            raise ValueError("LoLA layers keep constant-size state that cannot be rolled back: speculative decoding is not supported")
        tp = vllm_config.parallel_config.tensor_parallel_size
        if tp > 1:
            check_tensor_parallel(vllm_config.model_config.hf_config, tp)
        if cache.enable_prefix_caching:
            # The state after every block_size tokens is what a later request sharing the prefix
            # resumes from; the CPU platform changes an unset block_size after this check, so the
            # two block sizes would disagree unless the user sets it.
            if not cache.user_specified_block_size:
                raise ValueError(
                    "LoLA's prefix caching keeps the state every block_size tokens: pass block_size explicitly with enable_prefix_caching=True "
                    "(e.g. block_size=64; a multiple of 32 on CPU)"
                )
            if not vllm_config.scheduler_config.enable_chunked_prefill:
                raise ValueError("LoLA's prefix caching needs chunked prefill (vLLM's Mamba 'align' mode): leave enable_chunked_prefill on")
            cache.mamba_cache_mode = "align"
            cache.mamba_block_size = cache.block_size
            return
        cache.mamba_cache_mode = "none"
        if cache.mamba_block_size is None:
            cache.mamba_block_size = vllm_config.model_config.max_model_len


def check_tensor_parallel(hf_config, tp: int) -> None:
    """Refuse a tensor-parallel size whose ranks would not hold whole groups of heads, or
    different page shapes (vLLM keeps one page layout per layer for every rank): per-head sizes
    that differ between the ranks' shares of a layer.

    Raises:
        ValueError: naming the sizes and what would work.
    """
    from lola.pretrained.resolve import resolve_config

    heads, kv_heads = hf_config.num_attention_heads, getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    if kv_heads % tp:
        raise ValueError(
            f"tensor_parallel_size={tp} splits the model's {kv_heads} K/V heads unevenly: LoLA's ranks hold whole K/V heads "
            f"(and the query heads that read them); use a tensor_parallel_size that divides {kv_heads}"
        )
    cfg = resolve_config(getattr(hf_config, "lola", None))
    storage = kv_heads if cfg.gqa_storage == "kv_head" else heads
    for layer in range(hf_config.num_hidden_layers):
        layer_cfg = cfg.for_layer(layer)
        for field, combine in (("window_per_head", max), ("sparse_size_per_head", sum)):
            sizes = getattr(layer_cfg, field)
            if sizes is None:
                continue
            step = storage // tp
            shares = {combine(sizes[r * step : (r + 1) * step]) for r in range(tp)}
            if len(shares) > 1:
                raise ValueError(
                    f"layer {layer}: {field} {sizes} gives the {tp} ranks' shares of the heads state pages of different sizes "
                    f"({field.split('_per_head')[0]} {sorted(shares)}), and vLLM keeps one page layout per layer: use uniform sizes "
                    "(no per-head budgets) with tensor parallelism, or tensor_parallel_size=1"
                )


class LoLALlamaDecoderLayer(LlamaDecoderLayer):
    def __init__(self, vllm_config, prefix: str = "", config=None) -> None:
        super().__init__(vllm_config, prefix, config, attn_layer_type=LoLALlamaAttention)


class LoLALlamaForCausalLM(LlamaForCausalLM, HasInnerState, IsAttentionFree, SupportsMambaPrefixCaching):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=LoLALlamaDecoderLayer)

    def load_weights(self, weights):
        loaded = super().load_weights(weights)
        # LoLA parameters absent from a plain Llama checkpoint keep their initial values
        return loaded | {n for n, _ in self.named_parameters() if ".lola." in n}

    def get_mamba_state_copy_funcs(self, mamba_types):
        """One whole-page copy per state tensor of a LoLA layer (vLLM copies the running state
        to the page of a new block, and from a cached block on a prefix hit)."""
        counts = {len(m.get_state_shape()) for m in self.modules() if isinstance(m, LoLALlamaAttention)}
        if len(counts) != 1:
            raise ValueError(
                f"prefix caching copies the same states of every LoLA layer, but the layers hold {sorted(counts)} state tensors "
                "(per-head sparse sizes in some layers only): give every layer per-head sizes, or none, or run without prefix caching"
            )
        funcs = (get_temporal_copy_spec,) * counts.pop()
        return {t: funcs for t in mamba_types}

    @classmethod
    def get_mamba_state_copy_func(cls):
        raise NotImplementedError("LoLA layers hold a config-dependent number of states: see get_mamba_state_copy_funcs")
