"""LoLA on Hugging Face transformers models.

::

    from lola.integrations.transformers import apply_lola, LoLACache
    model = apply_lola(model, lola.LoLAConfig(window=64, sparse_size=64, sinks=4))
    out = model.generate(ids, max_new_tokens=32)  # a LoLACache is built automatically

    with lola.patch(model, cfg):  # apply_lola on entry, remove_lola on exit
        ...
"""

from lola.integrations.transformers.apply import apply_lola, attention_modules, patch, remove_lola
from lola.integrations.transformers.attention import lola_attention_forward, register_attention
from lola.integrations.transformers.cache import LoLACache, LoLACacheLayer
from lola.integrations.transformers.lolcats import load_lolcats_checkpoint
from lola.integrations.transformers.model_record import AppliedLoLA
from lola.integrations.transformers.pretrained import from_pretrained

__all__ = [
    "AppliedLoLA",
    "LoLACache",
    "LoLACacheLayer",
    "apply_lola",
    "attention_modules",
    "from_pretrained",
    "load_lolcats_checkpoint",
    "lola_attention_forward",
    "patch",
    "register_attention",
    "remove_lola",
]
