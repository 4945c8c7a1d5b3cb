"""Linearize a softmax model: attention transfer to a sliding-window + linear hybrid.

::

    from lola.linearize import LinearizeConfig, linearize
    linearize(model, tokenizer, LinearizeConfig(steps=400), out="runs/smollm2-hedgehog")
    apply_lola(model, lola.LoLAConfig(sparse_size=64), feature_maps="runs/smollm2-hedgehog")

or ``lola linearize --model smollm2-135m-instruct --out runs/smollm2-hedgehog``.
"""

from lola.linearize.folder import FeatureMaps, read_feature_maps, write_feature_maps
from lola.linearize.hybrid import hybrid_attention
from lola.linearize.teacher import LayerActivations, collect_activations
from lola.linearize.text import ByteTokenizer, load_text, split_text, token_chunks
from lola.linearize.transfer import LinearizeConfig, hybrid_config, layer_loss, linearize

__all__ = [
    "ByteTokenizer",
    "FeatureMaps",
    "LayerActivations",
    "LinearizeConfig",
    "collect_activations",
    "hybrid_attention",
    "hybrid_config",
    "layer_loss",
    "linearize",
    "load_text",
    "read_feature_maps",
    "split_text",
    "token_chunks",
    "write_feature_maps",
]
