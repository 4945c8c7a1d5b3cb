"""Class 1: attention LoLA does not reproduce, accepted.

Tiny transformers models with sliding windows that bind (or never do), soft-capping on the
final logits only, biases and rotary variants LoLA does reproduce, and models whose attention
was changed after ``apply_lola``. A valid model must be accepted *and* reproduce its stock
logits with nothing evicted; one whose attention LoLA would change must be refused naming why.
"""

from __future__ import annotations

import torch
from common import DROP, ids, reproduces, tiny, tiny_model
from harness import Case, accept, ensure, refuse

import lola

WINDOW = dict(sliding_window=16, max_position_embeddings=256)


def _apply(model):
    from lola.integrations.transformers import apply_lola, remove_lola

    apply_lola(model, lola.LoLAConfig())
    remove_lola(model)
    return model


def _reproduces(model, ctx) -> None:
    same, diff = reproduces(model)
    ensure(same, f"accepted, but with nothing evicted LoLA differs from the stock logits by {diff:.3g}")


def _refused_model(model_type: str, **config):
    return lambda ctx: _apply(tiny_model(model_type, **config))


def _accepted_model(model_type: str, **config):
    return lambda ctx: _apply(tiny_model(model_type, **config))


def _switched(how: str):
    """LoLA applied, then the attention implementation switched to sdpa, then ``how``."""

    def run(ctx):
        from lola.integrations.transformers import apply_lola

        model, _ = tiny()
        apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4))
        model.set_attn_implementation("sdpa")
        x = ids(12, 256)
        with torch.no_grad():
            if how == "no cache":
                return model(x, use_cache=False).logits.shape
            if how == "default cache":
                return type(model(x).past_key_values).__name__
            model.config._attn_implementation = "eager"
            return model.generate(x, max_new_tokens=2, do_sample=False).shape

    return run


def _layer_lola_deleted(ctx):
    """One layer's ``lola`` module deleted after apply_lola: that layer falls back to SDPA over
    the new keys alone (a LoLACache returns only the new tokens)."""
    from lola.integrations.transformers import LoLACache, apply_lola

    model, _ = tiny()
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4))
    del model.model.layers[0].self_attn.lola
    with torch.no_grad():
        return model.generate(ids(20, 256), max_new_tokens=4, do_sample=False, cache=LoLACache(model)).shape


def _dropout_in_training(ctx):
    from lola.integrations.transformers import apply_lola

    model = tiny_model("llama", attention_dropout=0.1)
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4))
    model.train()
    return model(ids(12), use_cache=False).logits.shape


def _mixed_cache_switch(ctx):
    """A generate() with a LoLACache after LoLA was removed and applied again with another config."""
    from lola.integrations.transformers import LoLACache, apply_lola, remove_lola

    model, _ = tiny()
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4))
    cache = LoLACache(model)
    with torch.no_grad():
        model(ids(12, 256), cache=cache)
    remove_lola(model)
    apply_lola(model, lola.LoLAConfig(window=16, sparse_size=0))
    with torch.no_grad():
        return model.generate(ids(12, 256), max_new_tokens=2, do_sample=False, cache=cache).shape


CASES = [
    Case(
        "attn-qwen2-window-in-layer-1-only",
        "attention",
        "Qwen2, use_sliding_window with max_window_layers=1: layer 1 of 2 slides (16 tokens)",
        _refused_model("qwen2", **WINDOW, use_sliding_window=True, max_window_layers=1),
        refuse("sliding window of 16", "force=True"),
    ),
    Case(
        "attn-qwen2-window-in-no-layer",
        "attention",
        "Qwen2, use_sliding_window but max_window_layers=2 of 2: no layer slides",
        _accepted_model("qwen2", **WINDOW, use_sliding_window=True, max_window_layers=2),
        accept(_reproduces),
    ),
    Case(
        "attn-qwen2-use-window-but-none",
        "attention",
        "Qwen2, use_sliding_window=True with sliding_window=None",
        _accepted_model("qwen2", sliding_window=None, max_position_embeddings=256, use_sliding_window=True, max_window_layers=0),
        accept(_reproduces),
    ),
    Case(
        "attn-mistral-window-one-below-context",
        "attention",
        "Mistral, sliding_window 255 in a 256-token context (binds, barely)",
        _refused_model("mistral", sliding_window=255, max_position_embeddings=256),
        refuse("sliding window of 255"),
    ),
    Case(
        "attn-mistral-window-equals-context",
        "attention",
        "Mistral, sliding_window = max_position_embeddings = 256 (never binds)",
        _accepted_model("mistral", sliding_window=256, max_position_embeddings=256),
        accept(_reproduces),
    ),
    Case(
        "attn-gemma3-window-beyond-context",
        "attention",
        "Gemma 3, sliding_window 512 in a 256-token context (never binds)",
        _accepted_model("gemma3_text", sliding_window=512, max_position_embeddings=256),
        accept(_reproduces),
    ),
    Case(
        "attn-gemma3-all-full-layers",
        "attention",
        "Gemma 3, sliding_window 16 but layer_types all full_attention",
        _accepted_model("gemma3_text", **WINDOW, layer_types=["full_attention", "full_attention"]),
        accept(_reproduces),
    ),
    Case(
        "attn-gemma2-binding-window-no-softcap",
        "attention",
        "Gemma 2 without logit soft-capping but a binding 16-token window",
        _refused_model("gemma2", **WINDOW, attn_logit_softcapping=None),
        refuse("sliding window of 16"),
    ),
    Case(
        "attn-gemma2-final-softcap-only",
        "attention",
        "Gemma 2 with final_logit_softcapping only (outside attention), window never binds",
        _accepted_model("gemma2", attn_logit_softcapping=None, final_logit_softcapping=30.0, sliding_window=4096, max_position_embeddings=256),
        accept(_reproduces),
    ),
    Case(
        "attn-starcoder2-binding-window",
        "attention",
        "Starcoder2 (verified type) with a binding 16-token window",
        _refused_model("starcoder2", **WINDOW),
        refuse("sliding window of 16"),
    ),
    Case(
        "attn-mixtral-binding-window",
        "attention",
        "Mixtral (verified type) with a binding 16-token window",
        _refused_model("mixtral", **WINDOW, num_local_experts=2, num_experts_per_tok=1),
        refuse("sliding window of 16"),
    ),
    Case(
        "attn-qwen3-binding-window",
        "attention",
        "Qwen3, use_sliding_window with max_window_layers=0 (every layer slides)",
        _refused_model("qwen3", **WINDOW, use_sliding_window=True, max_window_layers=0),
        refuse("sliding window of 16"),
    ),
    Case(
        "attn-llama-attention-bias",
        "attention",
        "Llama with attention_bias=True (biases before the attention function)",
        _accepted_model("llama", attention_bias=True),
        accept(_reproduces),
    ),
    Case(
        "attn-llama-linear-rope-scaling",
        "attention",
        "Llama with linear RoPE scaling (factor 2)",
        _accepted_model("llama", rope_scaling={"rope_type": "linear", "factor": 2.0}),
        accept(_reproduces),
    ),
    Case(
        "attn-phi-partial-rotary",
        "attention",
        "Phi with partial_rotary_factor 0.5 (half the head rotated)",
        _accepted_model("phi", partial_rotary_factor=0.5, head_dim=DROP),
        accept(_reproduces),
    ),
    Case(
        "attn-switched-forward-without-cache",
        "attention",
        "apply_lola, set_attn_implementation('sdpa'), then model(ids, use_cache=False)",
        _switched("no cache"),
        refuse("attention implementation", "sdpa"),
    ),
    Case(
        "attn-switched-forward-default-cache",
        "attention",
        "apply_lola, set_attn_implementation('sdpa'), then model(ids) (transformers makes a DynamicCache)",
        _switched("default cache"),
        refuse("attention implementation", "sdpa"),
    ),
    Case(
        "attn-config-implementation-edited",
        "attention",
        "apply_lola, then config._attn_implementation = 'eager' set by hand, then generate()",
        _switched("edited config"),
        refuse("attention implementation", "eager"),
    ),
    Case(
        "attn-one-layer-lola-deleted",
        "attention",
        "apply_lola, del layers[0].self_attn.lola, generate() with a LoLACache",
        _layer_lola_deleted,
        refuse("layer 0"),
    ),
    Case(
        "attn-dropout-in-training-mode",
        "attention",
        "Llama with attention_dropout 0.1 in train() mode after apply_lola",
        _dropout_in_training,
        refuse("dropout"),
    ),
    Case(
        "attn-cache-across-reapply",
        "attention",
        "a LoLACache used, LoLA removed and applied again with another config, generate() with the old cache",
        _mixed_cache_switch,
        refuse("stale"),
    ),
]
