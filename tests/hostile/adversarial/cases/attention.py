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

Batch 3. Masks, modes and positions: 4-D masks of other patterns (packed, bidirectional, a float
mask written as 0/1, ``-inf`` against large negatives, a soft bias, a row with nothing to attend
to, left padding built by hand) and 2-D masks with padding in the middle or on the right, each
against the stock model's logits; caches prefilled under ``torch.inference_mode()`` or
``no_grad`` and used outside, bfloat16 and float16 models, a cache reused for another batch or
reordered with wrong indices; and streams past the model's ``max_position_embeddings``: refused
with absolute positions, accepted with bounded ones (finite, in constant memory).
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
        "apply_lola with full_attention_layers=[0, 1] (no LoLA layer): refused as a config that does nothing, naming "
        "full_attention_layers (first expected to give the stock tokens; since round three an option that does nothing is refused)",
        _all_layers_full,
        either("full_attention_layers", check=_true),
    ),
    Case(
        "a2-beam-search-nothing-evicted",
        "attention",
        "generate(num_beams=2) with a LoLACache that evicts nothing: the stock beams (rows reordered each step)",
        _beams,
        accept(_true),
    ),
]


# -- batch 3: written before the round-three fixes, to measure them ---------------------------------

T = 12  # tokens of the mask cases


def _x(batch: int = 1, n: int = T, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 101, (batch, n), generator=torch.Generator().manual_seed(seed))


def _causal(n: int = T) -> torch.Tensor:
    return torch.tril(torch.ones(n, n, dtype=torch.bool))[None, None]


def _additive(allowed: torch.Tensor, masked: float) -> torch.Tensor:
    """A float mask: 0 where ``allowed``, ``masked`` elsewhere."""
    return torch.zeros(allowed.shape).masked_fill(~allowed, masked)


def _packed() -> torch.Tensor:
    mask = _causal().clone()
    mask[..., T // 2 :, : T // 2] = False  # two documents of six tokens, each causal, packed in one row
    return mask


def _soft_bias() -> torch.Tensor:
    mask = _additive(_causal(), float("-inf"))
    far = torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=-4)[None, None]
    return mask.masked_fill(far, -0.5)  # keys more than 3 back: a small penalty (an ALiBi-like bias), still attended


def _with_4d(make, cache: bool = False):
    """The tiny Llama with LoLA (nothing evicted) over 12 tokens given ``make()`` as its 4-D mask:
    the largest difference from the logits without a mask (causal attention)."""

    def run(ctx: Ctx):
        from ..builders import new_cache, stock_and_lola

        _, model = stock_and_lola()
        x = _x()
        with torch.no_grad():
            ref = model(x, use_cache=False).logits
            kwargs = {"cache": new_cache(model)} if cache else {"use_cache": False}
            out = model(x, attention_mask=make(), **kwargs).logits
        return float((out - ref).abs().max())

    return run


def _as_causal(diff, ctx) -> None:
    ensure(diff < 1e-5, f"accepted; the logits differ from causal attention's by {diff:.3g}")


def _not_causal(diff, ctx) -> None:
    from ..harness import CaseFailure

    raise CaseFailure(f"a mask LoLA cannot honour was read; the logits differ from plain causal attention's by {diff:.3g}")


def _row_without_keys(ctx: Ctx):
    """Two rows, the second's 4-D mask all False (no query may attend anywhere): row 0's logits
    against row 0 alone."""
    from ..builders import stock_and_lola

    _, model = stock_and_lola()
    x = _x(2)
    mask = _causal().expand(2, 1, T, T).clone()
    mask[1] = False
    with torch.no_grad():
        out = model(x, attention_mask=mask, use_cache=False).logits
        alone = model(x[:1], use_cache=False).logits
    return float((out[:1] - alone).abs().max())


def _first_row_alone(diff, ctx) -> None:
    ensure(diff < 1e-5, f"accepted; the first row's logits differ from its logits alone by {diff:.3g}")


def _against_stock(make_mask, decode: bool = False):
    """Two rows through the stock model and through LoLA (nothing evicted) with the same mask
    (``make_mask() -> (mask, real)``, ``real [2, T]`` the tokens whose logits count): the largest
    difference at real tokens; with ``decode``, then one more token per row (the mask grown by a
    column of ones) through each model's cache, compared too."""

    def run(ctx: Ctx):
        from transformers import DynamicCache

        from ..builders import new_cache, stock_and_lola

        stock, model = stock_and_lola()
        x = _x(2)
        mask, real = make_mask()
        with torch.no_grad():
            ref_cache, cache = DynamicCache(), new_cache(model)
            ref = stock(x, attention_mask=mask, past_key_values=ref_cache).logits
            out = model(x, attention_mask=mask, cache=cache).logits
            diff = float((out - ref)[real].abs().max())
            if decode and mask.dim() == 2:
                nxt, grown = torch.tensor([[5], [6]]), torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], dim=1)
                ref = stock(nxt, attention_mask=grown, past_key_values=ref_cache).logits
                out = model(nxt, attention_mask=grown, cache=cache).logits
                diff = max(diff, float((out - ref).abs().max()))
        return diff

    return run


def _stock_logits(diff, ctx) -> None:
    ensure(diff < 1e-4, f"accepted; at real tokens the logits differ from the stock model's by {diff:.3g}")


def _middle_padding():
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, 4:7] = 0  # three padding tokens inside the second sequence
    return mask, mask.bool()


def _right_padding():
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, -4:] = 0
    return mask, mask.bool()


def _left_padding_4d():
    """Causal attention with the second row left-padded by 3, written by hand as a float 4-D mask
    (``finfo.min`` where masked, as transformers' eager masks are)."""
    real = torch.ones(2, T, dtype=torch.bool)
    real[1, :3] = False
    allowed = _causal()[0] & real[:, None, :]  # [2, T, T]: a real key at or before the query
    return _additive(allowed[:, None], torch.finfo(torch.float32).min), real


def _model_with_cache():
    from lola.integrations.transformers import apply_lola

    from ..builders import CACHE_CFG

    model, _ = tiny()
    apply_lola(model, lola.LoLAConfig(**CACHE_CFG))
    return model


def _prefilled(model, mode, batch: int = 1):
    from ..builders import new_cache

    cache = new_cache(model)
    x = torch.cat([ids(30, 256, seed=s) for s in range(1, batch + 1)])
    with mode():
        model(x, cache=cache)
    return cache


def _decode(model, cache, n: int = 4, batch: int = 1, grad: bool = False) -> torch.Tensor:
    out = []
    with torch.enable_grad() if grad else torch.no_grad():
        for t in range(n):
            out.append(model(torch.full((batch, 1), 7 + t), cache=cache).logits.detach())
    return torch.cat(out, dim=1)


def _inference_then_autograd(ctx: Ctx):
    """A cache prefilled under torch.inference_mode(), then four tokens decoded with autograd on."""
    model = _model_with_cache()
    out = _decode(model, _prefilled(model, torch.inference_mode), grad=True)
    return out, _decode(model, _prefilled(model, torch.no_grad))


def _pair_same(pair, ctx) -> None:
    out, ref = pair
    ensure(bool(torch.isfinite(out).all()), "accepted; the logits hold inf or NaN")
    diff = float((out.float() - ref.float()).abs().max())
    ensure(diff <= 1e-5, f"accepted; the logits differ from those of a cache prefilled outside the mode by {diff:.3g}")


def _no_grad_then_backward(ctx: Ctx):
    """A cache prefilled under no_grad, then one token with autograd on and a backward pass."""
    model = _model_with_cache()
    cache = _prefilled(model, torch.no_grad)
    with torch.enable_grad():
        model(torch.tensor([[7]]), cache=cache).logits.float().pow(2).mean().backward()
    grad = model.model.layers[1].self_attn.q_proj.weight.grad
    return None if grad is None else bool(torch.isfinite(grad).all() and grad.abs().sum() > 0)


def _inference_then_reorder(ctx: Ctx):
    """Two rows prefilled under torch.inference_mode(), swapped with reorder_cache outside it, then decoded."""
    model = _model_with_cache()
    runs = []
    for mode in (torch.inference_mode, torch.no_grad):
        cache = _prefilled(model, mode, batch=2)
        cache.reorder_cache(torch.tensor([1, 0]))
        runs.append(_decode(model, cache, batch=2))
    return runs[0], runs[1]


def _half_model(dtype):
    """The tiny Llama cast to ``dtype`` before LoLA is applied (nothing evicted), 40 tokens: the
    largest difference from the stock model in that dtype, relative to its largest logit."""

    def run(ctx: Ctx):
        from ..builders import new_cache, stock_and_lola

        stock, model = stock_and_lola(dtype=dtype)
        x = _x(1, 40)
        with torch.no_grad():
            ref = stock(x).logits.float()
            out = model(x, cache=new_cache(model)).logits.float()
        return float((out - ref).abs().max() / ref.abs().max())

    return run


def _close_to_stock(rel, ctx) -> None:
    ensure(rel == rel and rel < 0.05, f"accepted; the logits differ from the stock model's in the same dtype by {rel:.3g} of the largest")


def _cast_between(ctx: Ctx):
    """Two caches prefilled by the float32 model; one continued in float32, the model cast to
    bfloat16, the other continued: the relative difference."""
    model = _model_with_cache()
    a, b = _prefilled(model, torch.no_grad), _prefilled(model, torch.no_grad)
    ref = _decode(model, a)
    model.to(torch.bfloat16)
    out = _decode(model, b).float()
    return float((out - ref).abs().max() / ref.abs().max())


def _two_rows_then_one(ctx: Ctx):
    model = _model_with_cache()
    cache = _prefilled(model, torch.no_grad, batch=2)
    return _decode(model, cache, n=1, batch=1).shape


def _generate_reusing_cache(ctx: Ctx):
    """generate() of two prompts given a cache that holds one earlier prompt."""
    model = _model_with_cache()
    cache = _prefilled(model, torch.no_grad)
    x = torch.cat([ids(34, 256, seed=5), ids(34, 256, seed=6)])
    with torch.no_grad():
        return model.generate(x, max_new_tokens=2, do_sample=False, cache=cache).shape


def _reorder(index, how: str = "reorder"):
    def run(ctx: Ctx):
        model = _model_with_cache()
        cache = _prefilled(model, torch.no_grad, batch=2)
        if how == "reorder":
            cache.reorder_cache(index)
        else:
            cache.batch_select_indices(index)
        return _decode(model, cache, n=1, batch=cache.layers[0].state.batch_size).shape

    return run


def _rows_kept(shape, ctx) -> None:
    from ..harness import CaseFailure

    raise CaseFailure(f"the cache decoded on with logits of shape {tuple(shape)} (a mask of one entry picked rows of two)")


BOUNDED = dict(window=16, sparse_size=8, sinks=2, chunk=8)


def _bounded_stream(ctx: Ctx):
    """256 positions, bounded positions: 280 tokens, then 24 more one at a time."""
    from ..builders import new_cache, small_lola

    model = small_lola(lola.LoLAConfig(**BOUNDED, positions="bounded"))
    cache = new_cache(model)
    with torch.no_grad():
        first = model(_x(1, 280), cache=cache).logits
        held = cache.nbytes()
        more = [model(torch.tensor([[5 + t % 90]]), cache=cache).logits for t in range(24)]
    return held, cache.nbytes(), bool(torch.isfinite(first).all() and all(torch.isfinite(m).all() for m in more)), cache.get_seq_length()


def _constant_and_finite(result, ctx) -> None:
    held, after, finite, seen = result
    ensure(finite, "accepted; the logits hold inf or NaN")
    ensure(held == after, f"accepted; the cache grew from {held} to {after} bytes over 24 tokens")
    ensure(seen == 304, f"the cache says it has seen {seen} tokens, not 304")


def _past_context(cfg: dict, prefill: int = 300, decode: int = 0):
    """256 positions, ``cfg``: ``prefill`` tokens with a LoLACache, then ``decode`` more one at a time."""

    def run(ctx: Ctx):
        from ..builders import new_cache, small_lola

        model = small_lola(lola.LoLAConfig(**cfg))
        cache = new_cache(model)
        with torch.no_grad():
            model(_x(1, prefill), cache=cache)
            for t in range(decode):
                model(torch.tensor([[5 + t]]), cache=cache)
        return cache.get_seq_length()

    return run


def _fed(seen, ctx) -> None:
    from ..harness import CaseFailure

    raise CaseFailure(f"the model was fed {seen} positions, past its 256")


def _bounded_left_padded(ctx: Ctx):
    """Bounded positions, 256 positions: a left-padded batch of prompts of 250 and 244 tokens
    generating 12 tokens (past the context), against each prompt alone."""
    from ..builders import small_lola

    model = small_lola(lola.LoLAConfig(**BOUNDED, positions="bounded"))
    a, b = _x(1, 250, seed=1)[0], _x(1, 244, seed=2)[0]
    batch = torch.zeros(2, 250, dtype=torch.long)
    mask = torch.zeros(2, 250, dtype=torch.long)
    batch[0], batch[1, 6:] = a, b
    mask[0], mask[1, 6:] = 1, 1
    with torch.no_grad():
        both = model.generate(batch, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
        alone_a = model.generate(a[None], max_new_tokens=12, do_sample=False, pad_token_id=0)
        alone_b = model.generate(b[None], max_new_tokens=12, do_sample=False, pad_token_id=0)
    return torch.equal(both[0, 250:], alone_a[0, 250:]) and torch.equal(both[1, 250:], alone_b[0, 244:])


def _bounded_exact_distance_beyond(ctx: Ctx):
    from lola.integrations.transformers import apply_lola

    return apply_lola(tiny_model("llama"), lola.LoLAConfig(**BOUNDED, positions="bounded", exact_distance=1000))


BATCH_3 = [
    Case(
        "a3-mask4d-packed-with-cache",
        "attention",
        "a 4-D bool mask of two packed documents (block-diagonal, causal in each) given with a LoLACache",
        _with_4d(_packed, cache=True),
        refuse("attention_mask", check=_not_causal),
    ),
    Case(
        "a3-mask4d-bidirectional",
        "attention",
        "a 4-D bool mask of all True (bidirectional attention), no cache",
        _with_4d(lambda: torch.ones(1, 1, T, T, dtype=torch.bool)),
        refuse("attention_mask", check=_not_causal),
    ),
    Case(
        "a3-mask4d-float-written-as-0-1",
        "attention",
        "a causal 4-D float mask written as 1.0 (may attend) and 0.0 (masked), the way a bool mask reads",
        _with_4d(lambda: _causal().float()),
        refuse("attention_mask", check=_not_causal),
    ),
    Case(
        "a3-mask4d-float-minus-inf",
        "attention",
        "a causal 4-D float mask with -inf where masked: the logits of causal attention",
        _with_4d(lambda: _additive(_causal(), float("-inf"))),
        accept(_as_causal),
    ),
    Case(
        "a3-mask4d-float-finfo-min",
        "attention",
        "a causal 4-D float mask with finfo(float32).min where masked (transformers' own)",
        _with_4d(lambda: _additive(_causal(), torch.finfo(torch.float32).min)),
        accept(_as_causal),
    ),
    Case(
        "a3-mask4d-float-minus-1e4",
        "attention",
        "a causal 4-D float mask with -1e4 where masked (a large negative, not -inf), with a LoLACache",
        _with_4d(lambda: _additive(_causal(), -1e4), cache=True),
        accept(_as_causal),
    ),
    Case(
        "a3-mask4d-soft-bias",
        "attention",
        "a causal 4-D float mask adding -0.5 to keys more than 3 back (a bias LoLA cannot apply)",
        _with_4d(_soft_bias),
        refuse("attention_mask", check=_not_causal),
    ),
    Case(
        "a3-mask4d-row-with-no-keys",
        "attention",
        "two rows, the second's 4-D mask all False: the first row must read as it does alone",
        _row_without_keys,
        either("attention_mask", check=_first_row_alone),
    ),
    Case(
        "a3-mask4d-left-padding-by-hand",
        "attention",
        "a left-padded row's causal mask built by hand as a 4-D float mask, with a LoLACache: the stock logits",
        _against_stock(_left_padding_4d),
        accept(_stock_logits),
    ),
    Case(
        "a3-mask2d-padding-in-the-middle",
        "attention",
        "a 2-D mask with three padding tokens inside the second row, with a LoLACache: the stock logits at real tokens",
        _against_stock(_middle_padding),
        either("attention_mask", check=_stock_logits),
    ),
    Case(
        "a3-mask2d-right-padding",
        "attention",
        "a 2-D mask right-padding the second row by 4, with a LoLACache: the stock logits at real tokens",
        _against_stock(_right_padding),
        either("attention_mask", check=_stock_logits),
    ),
    Case(
        "a3-mask2d-right-padding-then-decode",
        "attention",
        "a right-padded batch prefilled, then one more token per row (mask grown by a column): the stock logits",
        _against_stock(_right_padding, decode=True),
        either("attention_mask", check=_stock_logits),
    ),
    Case(
        "a3-inference-mode-prefill-then-autograd",
        "attention",
        "a LoLACache prefilled under torch.inference_mode(), then four tokens decoded with autograd on",
        _inference_then_autograd,
        accept(_pair_same),
    ),
    Case(
        "a3-no-grad-prefill-then-backward",
        "attention",
        "a LoLACache prefilled under no_grad, then one token with autograd on and loss.backward()",
        _no_grad_then_backward,
        accept(lambda ok, ctx: ensure(ok is True, f"accepted; the projections' gradient is {ok!r} (none, zero or not finite)")),
    ),
    Case(
        "a3-inference-mode-prefill-then-reorder",
        "attention",
        "two rows prefilled under torch.inference_mode(), swapped by reorder_cache outside it, then decoded",
        _inference_then_reorder,
        accept(_pair_same),
    ),
    Case(
        "a3-bfloat16-model-then-apply",
        "attention",
        "the tiny Llama cast to bfloat16, then apply_lola (nothing evicted): logits near the stock bfloat16 model's",
        _half_model(torch.bfloat16),
        accept(_close_to_stock),
    ),
    Case(
        "a3-float16-model-then-apply",
        "attention",
        "the tiny Llama cast to float16, then apply_lola (nothing evicted): logits near the stock float16 model's",
        _half_model(torch.float16),
        accept(_close_to_stock),
    ),
    Case(
        "a3-cache-float32-model-cast-bfloat16",
        "attention",
        "a cache prefilled by the float32 model, the model cast to bfloat16, then decoding with that cache",
        _cast_between,
        either("dtype|bfloat16|float32", check=lambda rel, ctx: ensure(rel < 0.1, f"accepted; the logits differ from float32's by {rel:.3g} of the largest")),
    ),
    Case(
        "a3-cache-two-rows-then-one",
        "attention",
        "a LoLACache prefilled with two rows, then a token for one row",
        _two_rows_then_one,
        refuse("batch|rows"),
    ),
    Case(
        "a3-generate-reusing-a-one-row-cache",
        "attention",
        "generate() of two prompts given a LoLACache that holds one earlier prompt",
        _generate_reusing_cache,
        refuse("batch|rows|cache"),
    ),
    Case(
        "a3-reorder-cache-out-of-range",
        "attention",
        "LoLACache.reorder_cache([0, 5]) on a cache of two rows",
        _reorder(torch.tensor([0, 5])),
        refuse("rows|index"),
    ),
    Case(
        "a3-reorder-cache-negative",
        "attention",
        "LoLACache.reorder_cache([-1, 0]) on a cache of two rows (a negative row counts from the end in torch)",
        _reorder(torch.tensor([-1, 0])),
        refuse("rows|index"),
    ),
    Case(
        "a3-batch-select-short-bool-mask",
        "attention",
        "LoLACache.batch_select_indices(tensor([True])) on a cache of two rows (a mask of one entry for two rows)",
        _reorder(torch.tensor([True]), how="select"),
        refuse("rows|indices|mask", check=_rows_kept),
    ),
    Case(
        "a3-bounded-stream-past-context",
        "attention",
        "bounded positions on a 256-position model: 280 tokens, then 24 more: finite, the cache the same size",
        _bounded_stream,
        accept(_constant_and_finite),
    ),
    Case(
        "a3-absolute-forward-past-context",
        "attention",
        "absolute positions on a 256-position model: a forward of 300 tokens with a LoLACache",
        _past_context(BOUNDED),
        refuse("max_position_embeddings|positions", check=_fed),
    ),
    Case(
        "a3-absolute-decode-past-context",
        "attention",
        "absolute positions on a 256-position model: 250 tokens, then 10 decoded one at a time past 256",
        _past_context(BOUNDED, prefill=250, decode=10),
        refuse("max_position_embeddings|positions", check=_fed),
    ),
    Case(
        "a3-bounded-with-a-full-layer-past-context",
        "attention",
        "bounded positions but layer 0 kept as full attention, 256 positions: a forward of 300 tokens",
        _past_context({**BOUNDED, "positions": "bounded", "full_attention_layers": [0]}),
        refuse("max_position_embeddings|full_attention_layers", check=_fed),
    ),
    Case(
        "a3-bounded-left-padded-generate-past-context",
        "attention",
        "bounded positions, 256 positions: a left-padded batch (250 and 244 tokens) generating 12 tokens, each row as alone",
        _bounded_left_padded,
        accept(lambda same, ctx: ensure(same is True, "accepted; a row generated other tokens in the batch than alone")),
    ),
    Case(
        "a3-bounded-exact-distance-beyond-context",
        "attention",
        "apply_lola(positions='bounded', exact_distance=1000) on a model of 256 positions",
        _bounded_exact_distance_beyond,
        refuse("exact_distance"),
    ),
]

CASES = [*in_batch(1, BATCH_1), *in_batch(2, BATCH_2), *in_batch(3, BATCH_3)]
