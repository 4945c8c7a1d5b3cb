"""LoLA inside vLLM: a ``vllm.general_plugins`` plug-in.

It registers ``LoLALlamaForCausalLM``: vLLM's Llama with every attention replaced by a LoLA layer
that keeps its state (sinks, window, sparse cache, linear state) per sequence slot, managed by
vLLM like a Mamba layer's. Select it with ``hf_overrides={"architectures":
["LoLALlamaForCausalLM"], "lola": {...LoLAConfig fields...}}`` or the same keys in the model's
``config.json``.
"""

ARCH = "LoLALlamaForCausalLM"


def register() -> None:
    """Register the model, its state backend and its config hook (vLLM calls this in every
    process; it is idempotent)."""
    try:
        import lola  # noqa: F401
    except ImportError as e:  # pragma: no cover - an installation error
        raise ImportError("lola-attention-vllm needs lola: pip install --no-deps lola-attention (or -e <the lola repository>)") from e
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum, register_backend

    if ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCH, "lola_vllm.model:LoLALlamaForCausalLM")
    register_backend(MambaAttentionBackendEnum.CUSTOM, "lola_vllm.backend.LoLAAttentionBackend", is_mamba=True)
    from lola_vllm.model import LoLAModelConfig

    MODELS_CONFIG_MAP[ARCH] = LoLAModelConfig
