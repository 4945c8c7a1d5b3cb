"""Adversarial cases of class ``attention``: attention LoLA does not reproduce, accepted anyway.

Batch 1. Tiny transformers models with sliding windows that bind (or never do), soft-capping on
the final logits only, biases and rotary variants LoLA does reproduce, and models whose attention
was changed after ``apply_lola``. A valid model must be accepted *and* reproduce its stock logits
with nothing evicted; one whose attention LoLA would change must be refused naming why.

Batch 2. Verified architectures not probed before (Qwen3-MoE, EXAONE 4, OLMo 3, Qwen2-MoE,
Granite, Cohere), windows of one token, layers kept as stock attention, and the same refusal
reached through other entry points: ``--model`` a Hugging Face folder for ``lola niah`` and ``lola
perplexity``, and lm-eval's ``LoLALM``. Valid variants must be accepted and reproduce their stock
logits with nothing evicted; a patched model copied or cast must keep working.
"""

from __future__ import annotations

import copy

import torch

import lola

from ...common import DROP, tiny_model
from ..builders import cli_q, hf_folder, ids, perplexity, reproduces, tiny
from ..harness import Case, Ctx, accept, either, ensure, in_batch, refuse

WINDOW = dict(sliding_window=16, max_position_embeddings=256)


def _apply(model, **cfg):
    from lola.integrations.transformers import apply_lola, remove_lola

    apply_lola(model, lola.LoLAConfig(**cfg))
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


MOE = dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16)


def _model(model_type: str, **config):
    return lambda ctx: _apply(tiny_model(model_type, **config))


def _kept_layer(ctx: Ctx):
    """Gemma 3 whose layer 0 slides (16 tokens) and layer 1 does not; layer 0 kept as stock
    attention (``full_attention_layers=[0]``): LoLA changes nothing the model does."""
    from lola.integrations.transformers import patch

    model = tiny_model("gemma3_text", **WINDOW, layer_types=["sliding_attention", "full_attention"])
    x = ids(40, model.config.vocab_size)
    cfg = lola.LoLAConfig(window=64, sparse_size=0, sinks=0, chunk=64, full_attention_layers=[0])
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "q_proj"):
                m.q_proj.weight.mul_(8)
        ref = model(x).logits
        with patch(model, cfg):
            out = model(x, use_cache=False).logits
    return float((out - ref).abs().max())


def _small(diff, ctx) -> None:
    ensure(diff < 1e-3, f"accepted, but the logits differ from the stock ones by {diff:.3g}")


def _binding_folder(ctx: Ctx):
    return hf_folder(ctx.path("mistral"), "mistral", sliding_window=16)


def _lm_eval_folder(ctx: Ctx):
    from lola.integrations.lm_eval.model import LoLALM

    return LoLALM(pretrained=str(_binding_folder(ctx)), device="cpu", window=8, sparse_size=8)


def _deepcopy(ctx: Ctx):
    """A patched model deep-copied: the copy generates as the original does, with its own cache
    and with the one generate() builds."""
    from lola.integrations.transformers import LoLACache, apply_lola

    model, _ = tiny()
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4))
    twin = copy.deepcopy(model)
    x = ids(30, 256)
    with torch.no_grad():
        a = model.generate(x, max_new_tokens=4, do_sample=False)
        b = twin.generate(x, max_new_tokens=4, do_sample=False)
        c = twin.generate(x, max_new_tokens=4, do_sample=False, cache=LoLACache(twin))
    return torch.equal(a, b) and torch.equal(a, c)


def _true(value, ctx) -> None:
    ensure(value is True, f"accepted, but the result differs ({value!r})")


def _double(ctx: Ctx):
    """apply_lola, then the whole model cast to float64: logits against the float32 ones."""
    from lola.integrations.transformers import LoLACache, apply_lola

    model, _ = tiny()
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4))
    x = ids(30, 256)
    with torch.no_grad():
        ref = model(x, cache=LoLACache(model)).logits
        model.double()
        out = model(x, cache=LoLACache(model)).logits
    return float((out.float() - ref).abs().max())


def _all_layers_full(ctx: Ctx):
    """full_attention_layers names every layer: generate() (its default cache) must give the stock tokens."""
    from lola.integrations.transformers import apply_lola

    model, _ = tiny()
    x = ids(20, 256)
    with torch.no_grad():
        ref = model.generate(x, max_new_tokens=4, do_sample=False)
        apply_lola(model, lola.LoLAConfig(full_attention_layers=[0, 1]))
        out = model.generate(x, max_new_tokens=4, do_sample=False)
    return torch.equal(ref, out)


def _beams(ctx: Ctx):
    """Beam search (cache rows reordered every step) with nothing evicted: the stock beams."""
    from lola.integrations.transformers import LoLACache, apply_lola

    model, _ = tiny()
    x = ids(20, 256)
    with torch.no_grad():
        ref = model.generate(x, max_new_tokens=4, num_beams=2, do_sample=False)
        apply_lola(model, lola.LoLAConfig(window=64, sparse_size=0, sinks=0, chunk=64))
        out = model.generate(x, max_new_tokens=4, num_beams=2, do_sample=False, cache=LoLACache(model))
    return torch.equal(ref, out)


NIAH_FOLDER = ["--lengths", "400", "--samples", "1", "--max-new-tokens", "1"]


# -- batch 1: written before the fixes it led to ----------------------------------------------------

BATCH_1 = [
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

# -- batch 2: written after them, to check that they hold ------------------------------------------

BATCH_2 = [
    Case(
        "a2-qwen3-moe-binding-window",
        "attention",
        "Qwen3-MoE (verified type), use_sliding_window with a binding 16-token window in every layer",
        _model("qwen3_moe", **WINDOW, **MOE, use_sliding_window=True, max_window_layers=0),
        refuse("sliding window of 16"),
    ),
    Case(
        "a2-exaone4-binding-window-layer-0",
        "attention",
        "EXAONE 4 with sliding_window_pattern 2: layer 0 slides (16 tokens), layer 1 is full",
        _model("exaone4", **WINDOW, sliding_window_pattern=2),
        refuse("sliding window of 16"),
    ),
    Case(
        "a2-olmo3-binding-window",
        "attention",
        "OLMo 3 (verified type) with a binding 16-token window",
        _model("olmo3", **WINDOW),
        refuse("sliding window of 16"),
    ),
    Case(
        "a2-mistral-window-of-one-token",
        "attention",
        "Mistral with sliding_window=1 (each token sees itself only)",
        _model("mistral", sliding_window=1, max_position_embeddings=256),
        refuse("sliding window of 1"),
    ),
    Case(
        "a2-qwen2-moe-window-flag-unused",
        "attention",
        "Qwen2-MoE with use_sliding_window=True and a 16-token window its attention never applies",
        _model("qwen2_moe", **WINDOW, **MOE, shared_expert_intermediate_size=16, use_sliding_window=True, max_window_layers=0),
        accept(_reproduces),
    ),
    Case(
        "a2-granite-attention-multiplier",
        "attention",
        "Granite with attention_multiplier 0.5 (its own softmax scale)",
        _model("granite", attention_multiplier=0.5),
        accept(_reproduces),
    ),
    Case(
        "a2-gemma2-query-pre-attn-scalar",
        "attention",
        "Gemma 2 without soft-capping, query_pre_attn_scalar 7 (scale 7**-0.5, not head_dim's)",
        _model("gemma2", attn_logit_softcapping=None, sliding_window=4096, max_position_embeddings=256, query_pre_attn_scalar=7),
        accept(_reproduces),
    ),
    Case(
        "a2-cohere-qk-norm",
        "attention",
        "Cohere with use_qk_norm (normalised queries and keys before RoPE)",
        _model("cohere", use_qk_norm=True),
        accept(_reproduces),
    ),
    Case(
        "a2-cohere2-window-but-no-sliding-layer",
        "attention",
        "Cohere 2 with sliding_window 16 but layer_types all full_attention",
        _model("cohere2", **WINDOW, layer_types=["full_attention", "full_attention"]),
        accept(_reproduces),
    ),
    Case(
        "a2-llama-dropout-in-eval-mode",
        "attention",
        "Llama with attention_dropout 0.3, in eval() mode (dropout off)",
        _model("llama", attention_dropout=0.3),
        accept(_reproduces),
    ),
    Case(
        "a2-gemma3-sliding-layer-kept-stock",
        "attention",
        "Gemma 3, layer 0 slides (16 tokens), full_attention_layers=[0] keeps it stock: LoLA runs only where attention is full",
        _kept_layer,
        accept(_small),
    ),
    Case(
        "a2-lm-eval-folder-binding-window",
        "attention",
        "lm-eval LoLALM(pretrained=FOLDER) where the folder holds a Mistral with a binding 16-token window",
        _lm_eval_folder,
        refuse("sliding window of 16"),
    ),
    Case(
        "a2-niah-folder-binding-window",
        "attention",
        "lola niah --model FOLDER --methods window, the folder a Mistral with a binding 16-token window",
        lambda ctx: cli_q(["niah", "--model", str(_binding_folder(ctx)), *NIAH_FOLDER, "--methods", "window", "--out", str(ctx.path("r"))]),
        refuse("sliding window of 16"),
    ),
    Case(
        "a2-perplexity-folder-binding-window",
        "attention",
        "lola perplexity --model FOLDER --methods lola, the folder a Mistral with a binding 16-token window",
        lambda ctx: cli_q(perplexity(str(_binding_folder(ctx)), "lola", "--text", str(ctx.write("t.txt", "The sea is wide and the ships are slow. " * 80)))),
        refuse("sliding window of 16"),
    ),
    Case(
        "a2-patched-model-deep-copied",
        "attention",
        "copy.deepcopy of a patched model: generate() of the copy, with and without a LoLACache, equals the original's",
        _deepcopy,
        accept(_true),
    ),
    Case(
        "a2-patched-model-cast-to-float64",
        "attention",
        "apply_lola, then model.double(): a forward with a new LoLACache (logits against float32's)",
        _double,
        either("dtype|float64", check=lambda diff, ctx: ensure(diff < 1e-3, f"logits differ from float32's by {diff:.3g}")),
    ),
    Case(
        "a2-every-layer-kept-full",
        "attention",
        "apply_lola with full_attention_layers=[0, 1] (no LoLA layer): generate() gives the stock tokens",
        _all_layers_full,
        accept(_true),
    ),
    Case(
        "a2-beam-search-nothing-evicted",
        "attention",
        "generate(num_beams=2) with a LoLACache that evicts nothing: the stock beams (rows reordered each step)",
        _beams,
        accept(_true),
    ),
]

CASES = [*in_batch(1, BATCH_1), *in_batch(2, BATCH_2)]
