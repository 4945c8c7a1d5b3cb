"""LoLA Llama for vLLM: the Llama model with LoLA attention layers, and its config checks."""

from vllm.logger import init_logger
from vllm.model_executor.models.config import VerifyAndUpdateConfig
from vllm.model_executor.models.interfaces import HasInnerState, IsAttentionFree
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM

from lola_vllm.layer import LoLALlamaAttention

logger = init_logger(__name__)


class LoLAModelConfig(VerifyAndUpdateConfig):
    """Refuse what a constant-size state cannot do, and keep one state page per sequence."""

    @classmethod
    def verify_and_update_config(cls, vllm_config) -> None:
        cache = vllm_config.cache_config
        if vllm_config.speculative_config is not None:
            raise ValueError("LoLA layers keep constant-size state that cannot be rolled back: speculative decoding is not supported")
        tp = vllm_config.parallel_config.tensor_parallel_size
        if tp > 1:
            raise ValueError(
                f"LoLA layers do not split their heads across ranks yet: run with tensor_parallel_size=1 (got {tp}); "
                "for more throughput run several engines (data parallel), each with its own state pages"
            )
        if cache.enable_prefix_caching:
            raise ValueError("LoLA layers keep constant-size state that cannot be restored at a cached prefix: run with enable_prefix_caching=False")
        cache.mamba_cache_mode = "none"
        if cache.mamba_block_size is None:
            cache.mamba_block_size = vllm_config.model_config.max_model_len


class LoLALlamaDecoderLayer(LlamaDecoderLayer):
    def __init__(self, vllm_config, prefix: str = "", config=None) -> None:
        super().__init__(vllm_config, prefix, config, attn_layer_type=LoLALlamaAttention)


class LoLALlamaForCausalLM(LlamaForCausalLM, HasInnerState, IsAttentionFree):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=LoLALlamaDecoderLayer)

    def load_weights(self, weights):
        loaded = super().load_weights(weights)
        # LoLA parameters absent from a plain Llama checkpoint keep their initial values
        return loaded | {n for n, _ in self.named_parameters() if ".lola." in n}
