"""LoLA on Hugging Face transformers models.

::

    from lola.integrations.transformers import apply_lola, LoLACache
    model = apply_lola(model, lola.LoLAConfig(window=64, sparse_size=64, sinks=4))
    out = model.generate(ids, max_new_tokens=32, past_key_values=LoLACache(model))
"""

from lola.integrations.transformers.apply import apply_lola, attention_modules, remove_lola
from lola.integrations.transformers.attention import lola_attention_forward, register_attention
from lola.integrations.transformers.cache import LoLACache, LoLACacheLayer
from lola.integrations.transformers.lolcats import load_lolcats_checkpoint

__all__ = ["LoLACache", "LoLACacheLayer", "apply_lola", "attention_modules", "load_lolcats_checkpoint", "lola_attention_forward", "register_attention", "remove_lola"]
