"""lola: LoLA attention (sliding window + sparse cache + linear state), composable and exact.

Quick use::

    import lola
    cfg = lola.LoLAConfig(window=64, sparse_size=64, sinks=4, chunk=64, policy="sre")
    attn = lola.compose(cfg, num_heads=8, head_dim=64)
    o, state = attn(q, k, v)            # q: [B, T, H, D]; k, v: [B, T, H_kv, D]
    o2, state = attn(q2, k2, v2, state=state)

On a transformers model::

    with lola.patch(model, cfg):        # apply_lola on entry, remove_lola on exit
        out = model.generate(ids)       # a LoLACache is built automatically
"""

from lola import _moved, budgets, memory, models, policies, schedules, scorers
from lola.config import LoLAConfig
from lola.core import LinearPartial, MixingRule, SoftmaxPartial
from lola.core.positions import BoundedPositions, RotaryEmbedding
from lola.engine.composer import LoLAMemory
from lola.io.provenance import DISTRIBUTION, __version__
from lola.layer import LoLAAttention, compose, memory_from_config
from lola.memory.allocation import max_state_bytes, set_max_state_bytes

_moved.install()  # the old names of modules that moved into packages

__all__ = [
    "BoundedPositions",
    "LinearPartial",
    "LoLAAttention",
    "LoLAConfig",
    "LoLAMemory",
    "MixingRule",
    "RotaryEmbedding",
    "SoftmaxPartial",
    "__version__",
    "budgets",
    "compose",
    "memory",
    "memory_from_config",
    "models",
    "policies",
    "schedules",
    "scorers",
    "max_state_bytes",
    "set_max_state_bytes",
    "apply_lola",
    "remove_lola",
    "patch",
    "LoLACache",
    "from_pretrained",
]

_TRANSFORMERS_API = ("apply_lola", "remove_lola", "patch", "LoLACache", "from_pretrained")


def __getattr__(name: str):
    # The transformers integration is imported on first use, so that `import lola` stays light.
    if name in _TRANSFORMERS_API:
        try:
            from lola.integrations import transformers as integration
        except ImportError as e:
            raise ImportError(f"lola.{name} needs transformers, from the hf extra (pip install '{DISTRIBUTION}[hf]'): {e}") from e
        return getattr(integration, name)
    raise AttributeError(f"module 'lola' has no attribute {name!r}")
