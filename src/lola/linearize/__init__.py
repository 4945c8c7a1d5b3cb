"""Linearize a softmax model into a sliding-window + linear hybrid, in LoLCATs' two stages.

Stage 1 (:func:`linearize`, attention transfer) trains each layer's feature maps to imitate its
softmax attention; stage 2 (:func:`finetune`) trains LoRA adapters, maps and window factors end
to end against the stock model's next-token distribution::

    from lola.linearize import FinetuneConfig, LinearizeConfig, finetune, linearize
    linearize(model, tokenizer, LinearizeConfig(steps=150), out="runs/smollm2")
    finetune(model, tokenizer, FinetuneConfig(steps=120), out="runs/smollm2")
    apply_lola(fresh_model, lola.LoLAConfig(sparse_size=64), feature_maps="runs/smollm2")

or ``lola linearize --model smollm2-135m-instruct --out runs/smollm2`` (both stages; under
``torchrun --nproc_per_node N`` data parallel).
"""

from lola.linearize.finetuning import FinetuneConfig, distillation_loss, finetune
from lola.linearize.hybrid import hybrid_attention
from lola.linearize.teacher import LayerActivations, collect_activations
from lola.linearize.transfer import LinearizeConfig, hybrid_config, layer_loss, linearize
from lola.pretrained.folder import FeatureMaps, read_feature_maps, write_feature_maps
from lola.pretrained.lora import LoraSpec, merge_lora, restore_weights

__all__ = [
    "FeatureMaps",
    "FinetuneConfig",
    "LoraSpec",
    "LayerActivations",
    "LinearizeConfig",
    "collect_activations",
    "distillation_loss",
    "finetune",
    "hybrid_attention",
    "hybrid_config",
    "layer_loss",
    "linearize",
    "merge_lora",
    "read_feature_maps",
    "restore_weights",
    "write_feature_maps",
]
