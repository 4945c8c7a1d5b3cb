"""Adversarial cases of class ``state``: state and cache integrity.

Batch 1. States no run could have written (a negative normaliser, a window token in the wrong ring
slot, sinks that are not the first tokens, mismatched shapes and dtypes), states moved to another
layer or model, and scoring policies or schedules that misbehave. A state must be refused when it
is loaded (or at latest when it is used) naming the tensor; a valid state, or a policy's harmless
quirk, must give the right result.

Batch 2. States with odd storage (non-contiguous, stride-0, requiring grad, on the ``meta``
device), a ``seen`` count that jumped ahead of the tokens held, saved caches whose ``cache.json``
was edited with its checksum recomputed (judged by whether the values are still validated), a
cache fed another batch, and schedule and policy plug-ins answering with the wrong kind of value
(floats, Python ints, exceptions, absurd periods, tensors on another device).

Batch 3. Layouts checked, not totals: states, rows and bound state pages moved into layers whose
per-head sparse sizes, window sizes, sinks or feature maps differ while every shape matches (and
the same layout spelled two ways, which must load); states, pages and caches made under
``torch.inference_mode()`` and used outside it; saved caches of two rows reordered, grown rows,
and caches loaded into the same weights under another LoLA config.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import lola

from ...common import edit_cache
from ..builders import CACHE_CFG, LAYER_CFG, attend, continue_with, ids, layer, layer_and_state, policy, saved_cache, schedule, step, tiny
from ..harness import Case, CaseFailure, Ctx, accept, either, ensure, in_batch, refuse


def _harm(pair, ctx) -> None:
    """Describes an accepted bad state by its effect: the outputs against the unedited state's."""
    out, ref = pair
    ensure(bool(torch.isfinite(out).all()), "nothing flagged it; the outputs hold inf or NaN")
    diff = float((out.float() - ref.float()).abs().max())
    if diff > 1e-5:
        raise CaseFailure(f"nothing flagged it; the outputs differ from the unedited state's by up to {diff:.3g}")
    raise CaseFailure("nothing flagged it (the outputs equal the unedited state's here)")


def _same(pair, ctx) -> None:
    out, ref = pair
    ensure(bool(torch.isfinite(out).all()), "accepted; outputs hold inf or NaN")
    diff = float((out.float() - ref.float()).abs().max())
    ensure(diff <= 1e-5, f"accepted; outputs differ from the unedited state's by {diff:.3g}")


def _load_and_step(cfg, edit, load_cfg=None):
    """A layer's state edited by ``edit(sd)``, loaded into a fresh state, then six more tokens;
    returns those outputs and the ones from the unedited state."""

    def run(ctx):
        attn, _, sd = layer_and_state(cfg)
        target = attn if load_cfg is None else layer(load_cfg)
        ref = None
        if load_cfg is None:
            ref_state = attn.new_state()
            ref_state.load_state_dict({k: t.clone() for k, t in sd.items()})
            ref = step(attn, ref_state)
        edit(sd)
        state = target.new_state()
        state.load_state_dict(sd)
        return step(target, state), ref

    return run


def _negative_s(sd):
    sd["linear.s"] = -sd["linear.s"].abs() - 1.0


def _roll_window(sd):
    for key in ("window.k", "window.v", "window.pos"):
        sd[key] = sd[key].roll(1, dims=2)


def _sinks_elsewhere(sd):
    held = {int(p) for key in ("window.pos", "sparse.pos", "sinks.pos") for p in sd[key].flatten() if p >= 0}
    free = [p for p in range(2, int(sd["seen"][0])) if p not in held][:2]
    sd["sinks.pos"] = torch.tensor(free).view(1, 1, 2).expand_as(sd["sinks.pos"]).clone()


def _two_rows_one_seen(sd):
    for key in ("window.k", "window.v", "window.pos"):
        sd[key] = torch.cat([sd[key], sd[key]])


def _drop_acc(sd):
    for key in [k for k in sd if k.endswith(".acc")]:
        del sd[key]


def _pos_int32(sd):
    for key in ("sinks.pos", "window.pos", "sparse.pos"):
        sd[key] = sd[key].int()


def _extra_key(sd):
    sd["window.extra"] = torch.zeros(1)


def _cache_edit(change, n: int = 6):
    """A saved tiny cache edited by ``change(tensors)`` (sums recomputed), loaded, then used."""

    def run(ctx):
        import shutil

        from lola.integrations.transformers import LoLACache

        model, _ = saved_cache(ctx.path("c"))
        shutil.copytree(ctx.path("c"), ctx.path("unedited"))
        edit_cache(ctx.path("c"), change)
        cache = LoLACache.load(ctx.path("c"), model)
        out = continue_with(model, cache, n)
        return out, continue_with(model, LoLACache.load(ctx.path("unedited"), model), n)

    return run


def _slice_d(key_prefix):
    def change(t):
        for side in ("k", "v"):
            t[f"{key_prefix}.{side}"] = t[f"{key_prefix}.{side}"][..., :8].contiguous()

    return change


def _cast(keys, dtype):
    def change(t):
        for key in keys:
            t[key] = t[key].to(dtype)

    return change


def _swap_layers(ctx):
    from lola.integrations.transformers import LoLACache, apply_lola

    model, _ = tiny()
    apply_lola(model, lola.LoLAConfig(**CACHE_CFG))
    cache = LoLACache(model)
    with torch.no_grad():
        model(ids(30, 256), cache=cache)
    ref_cache = LoLACache(model)
    with torch.no_grad():
        model(ids(30, 256), cache=ref_cache)
    ref = continue_with(model, ref_cache)
    cache.layers[0].state, cache.layers[1].state = cache.layers[1].state, cache.layers[0].state
    return continue_with(model, cache), ref


def _state_from_other_model(ctx):
    from lola.integrations.transformers import LoLACache, apply_lola
    from lola.models import tiny_random

    a, b = tiny()[0], tiny_random(seed=1)[0]
    caches = []
    for m in (a, b):
        apply_lola(m, lola.LoLAConfig(**CACHE_CFG))
        caches.append(LoLACache(m))
        with torch.no_grad():
            m(ids(30, 256), cache=caches[-1])
    ref_cache = LoLACache(b)
    with torch.no_grad():
        b(ids(30, 256), cache=ref_cache)
    ref = continue_with(b, ref_cache)
    caches[1].layers[0].state = caches[0].layers[0].state
    return continue_with(b, caches[1]), ref


def _ragged_roundtrip(ctx):
    """Per-head sparse sizes (ragged storage): save, load into a fresh model, continue."""
    from lola.integrations.transformers import LoLACache, apply_lola

    model, cache = saved_cache(ctx.path("c"), sparse_size_per_head=[4, 1])
    ref = continue_with(model, cache)
    other, _ = tiny()
    apply_lola(other, lola.LoLAConfig(**{**CACHE_CFG, "sparse_size_per_head": [4, 1]}))
    return continue_with(other, LoLACache.load(ctx.path("c"), other)), ref


def _unused_roundtrip(ctx):
    """A cache that never saw a token: saved, loaded, then used as a fresh one."""
    from lola.integrations.transformers import LoLACache, apply_lola

    model, _ = tiny()
    apply_lola(model, lola.LoLAConfig(**CACHE_CFG))
    LoLACache(model).save(ctx.path("c"))
    loaded = LoLACache.load(ctx.path("c"), model)
    return continue_with(model, loaded), continue_with(model, LoLACache(model))


def _scorer(fn, needs_attention=False):
    @dataclass(frozen=True)
    class Scorer:
        def score(self, candidates, ctx):
            return fn(candidates)

    Scorer.needs_attention = needs_attention
    return Scorer


def _with_policy(name, factory, check_sparse=False, padded=False):
    """A layer scoring with the plug-in ``factory``, over 40 tokens; returns (outputs, sparse slots held)."""

    def run(ctx):
        with policy(name, factory):
            attn = layer(lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4, policy=name))
            o, state = attend(attn, state=attn.new_state())
            return o, int((state.sparse.block.pos >= 0).sum(-1).min())

    return run


def _sparse_full(result, ctx) -> None:
    out, held = result
    ensure(bool(torch.isfinite(out).all()), "accepted; outputs hold inf or NaN")
    ensure(held == 4, f"accepted; the sparse cache holds {held} of 4 tokens though 26 candidates were offered (empty slots kept over tokens)")


def _nan_on_empty(c):
    s = c.pos.float()
    return torch.where(c.valid, s, torch.full_like(s, float("nan")))


class _BuildsNothing:
    """Passes registration (it has a ``score``) but building it gives a plain ``object()``."""

    def __new__(cls, **kwargs):
        return object()

    def score(self, candidates, ctx):  # pragma: no cover - never reached
        return candidates.pos.float()


def _function_factory(**kwargs):
    """A factory function (documented as allowed) returning a built-in policy."""
    from lola.policies import Recency

    return Recency()


def _padded_with_schedule(name, until):
    """A layer whose schedule plug-in answers ``until`` tokens until its step (period 4), over a
    left-padded batch of 40 tokens (the per-row path)."""

    def run(ctx):
        with schedule(name, lambda seen: torch.full_like(seen, until)):
            attn = layer(lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4, schedule=name))
            mask = torch.ones(2, 40, dtype=torch.bool)
            mask[1, :3] = False  # a left-padded batch: the per-row path
            o, _ = attend(attn, batch=2, padding_mask=mask)
            return o.shape

    return run


LOLCATS = lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4, mixing="lolcats")
ATTENTION = lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4, policy="attention")
F8 = lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4, feature_map="hedgehog", feature_dim=8)
F16 = lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4, feature_map="hedgehog", feature_dim=16)


def _views(sd):
    """Every tensor of 3+ dims as a transposed-back view (same values, non-contiguous strides)."""
    for k, t in list(sd.items()):
        if t.dim() >= 3:
            sd[k] = t.transpose(-1, -2).contiguous().transpose(-1, -2)
            assert not sd[k].is_contiguous()


def _requires_grad_with_grad_on(ctx: Ctx):
    """A state whose float tensors require grad, loaded and run with autograd on."""
    attn, _, sd = layer_and_state()
    ref_state = attn.new_state()
    ref_state.load_state_dict({k: t.clone() for k, t in sd.items()})
    ref = step(attn, ref_state)
    for t in sd.values():
        if t.is_floating_point():
            t.requires_grad_(True)
    state = attn.new_state()
    state.load_state_dict(sd)
    x = torch.randn(1, 6, 4, 8, generator=torch.Generator().manual_seed(5))
    o, _ = attn(x, x[:, :, :2], x[:, :, :2], state=state)
    return o.detach(), ref


def _stride_zero_batch(ctx: Ctx):
    """A batch-2 state whose tensors are expand() views of a batch-1 state (stride 0 along the
    batch): both rows must continue exactly as the batch-1 state does."""
    attn, _, sd = layer_and_state()
    one = attn.new_state()
    one.load_state_dict({k: t.clone() for k, t in sd.items()})
    x = torch.randn(1, 6, 4, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref, _ = attn(x, x[:, :, :2], x[:, :, :2], state=one)
        two = attn.new_state()
        two.load_state_dict({k: t.expand(2, *t.shape[1:]) for k, t in sd.items()})
        x2 = x.expand(2, -1, -1, -1)
        out, _ = attn(x2, x2[:, :, :2], x2[:, :, :2], state=two)
    return out, ref.expand(2, -1, -1, -1)


def _window_not_newest(sd):
    """The window's positions shifted 16 back (still below seen, still distinct from sinks and
    sparse): a window that no longer holds the newest tokens."""
    pos = sd["window.pos"]
    held = {int(p) for key in ("sinks.pos", "sparse.pos") for p in sd[key].flatten() if p >= 0}
    shifted = torch.where(pos >= 0, pos - 16, pos)
    if any(int(p) in held for p in shifted.flatten() if p >= 0):
        shifted = torch.where(pos >= 0, pos - 17, pos)
    sd["window.pos"] = shifted


def _cache_fingerprint_of(cfg_b: dict):
    """A cache saved by a model with CACHE_CFG, its cache.json fingerprint rewritten to what a
    model with ``cfg_b`` records (checksum recomputed), loaded into that model and used."""

    def run(ctx: Ctx):
        from lola.integrations.transformers import LoLACache, apply_lola
        from lola.io.checksums import weights_digest

        saved_cache(ctx.path("c"))
        other, _ = tiny()
        apply_lola(other, lola.LoLAConfig(**{**CACHE_CFG, **cfg_b}))
        fingerprint = {**LoLACache(other).fingerprint, "weights": weights_digest(other, every_value=True)}
        edit_cache(ctx.path("c"), meta=lambda m: m.update(fingerprint=fingerprint))
        return continue_with(other, LoLACache.load(ctx.path("c"), other)).shape

    return run


def _cache_batch_switch(ctx: Ctx):
    from lola.integrations.transformers import LoLACache, apply_lola

    model, _ = tiny()
    apply_lola(model, lola.LoLAConfig(**CACHE_CFG))
    cache = LoLACache(model)
    with torch.no_grad():
        model(ids(30, 256), cache=cache)
        return model(torch.tensor([[7], [8]]), cache=cache).logits.shape


def _with_schedule(until, period=4, batch: int = 1):
    """A layer whose schedule plug-in (``period``) answers ``until(seen)``, over 40 tokens then one."""

    def run(ctx: Ctx):
        with schedule("plugin_schedule", until, period):
            attn = layer(lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4, schedule="plugin_schedule"))
            o, state = attend(attn, batch=batch)
            attend(attn, 1, batch=batch, state=state)
            return o

    return run


def _described(what: str):
    def check(result, ctx):
        raise CaseFailure(what)

    return check


# -- batch 1: written before the fixes it led to ----------------------------------------------------

BATCH_1 = [
    Case(
        "state-linear-s-negative",
        "state",
        "a state whose normaliser linear.s is negative (hedgehog features are positive), lolcats mixing",
        _load_and_step(LOLCATS, _negative_s),
        refuse("linear.s", check=_harm),
    ),
    Case(
        "state-window-token-in-wrong-ring-slot",
        "state",
        "window.k/v/pos rolled by one slot (each token off its ring slot p % capacity), then six more tokens",
        _load_and_step(LAYER_CFG, _roll_window),
        either("window.pos", check=_same),
    ),
    Case(
        "state-sinks-not-the-first-tokens",
        "state",
        "sinks.pos holds two later positions (held nowhere else) instead of 0 and 1",
        _load_and_step(LAYER_CFG, _sinks_elsewhere),
        either("sinks.pos", check=_same),
    ),
    Case("state-rows-disagree", "state", "window tensors with two rows, seen with one", _load_and_step(LAYER_CFG, _two_rows_one_seen), refuse("window")),
    Case(
        "state-unknown-key", "state", "a state dict with an extra key window.extra", _load_and_step(LAYER_CFG, _extra_key), refuse("window.extra", check=_harm)
    ),
    Case(
        "state-acc-missing-for-attention-policy",
        "state",
        "a state of a layer scored by 'attention' without its tracked attention (.acc tensors)",
        _load_and_step(ATTENTION, _drop_acc),
        refuse("acc"),
    ),
    Case(
        "state-feature-dim-of-other-maps",
        "state",
        "a state of a hedgehog f=8 layer loaded into a hedgehog f=16 layer, then used",
        _load_and_step(F8, lambda sd: None, load_cfg=F16),
        refuse("linear"),
    ),
    Case(
        "state-positions-int32",
        "state",
        "positions stored as int32 instead of int64 (valid values)",
        _load_and_step(LAYER_CFG, _pos_int32),
        either("pos", check=_same),
    ),
    Case(
        "state-seen-int32",
        "state",
        "'seen' stored as int32 instead of int64",
        _load_and_step(LAYER_CFG, lambda sd: sd.update(seen=sd["seen"].int())),
        either("seen", check=_same),
    ),
    Case(
        "state-layers-swapped-in-a-cache",
        "state",
        "LoLACache: layer 0's and layer 1's states swapped in memory, then decoding goes on",
        _swap_layers,
        refuse("layer", check=_harm),
    ),
    Case(
        "state-from-another-models-cache",
        "state",
        "a state object of model A's cache put into model B's cache (same config), then decoding",
        _state_from_other_model,
        refuse("another model", check=_harm),
    ),
    Case(
        "cache-sparse-head-dim-edited",
        "state",
        "saved cache with sparse.k/v of head_dim 8 (the model's is 16), sums recomputed, loaded and used",
        _cache_edit(_slice_d("layers.0.sparse")),
        refuse("sparse"),
    ),
    Case(
        "cache-sparse-float16",
        "state",
        "saved cache with sparse.k/v in float16 (model float32), sums recomputed, loaded and used",
        _cache_edit(_cast(["layers.0.sparse.k", "layers.0.sparse.v"], torch.float16)),
        refuse("sparse.k", check=_harm),
    ),
    Case(
        "cache-window-float64",
        "state",
        "saved cache with window.k/v in float64 (model float32), sums recomputed, loaded and used",
        _cache_edit(_cast(["layers.0.window.k", "layers.0.window.v"], torch.float64)),
        refuse("window.k"),
    ),
    Case(
        "cache-linear-int",
        "state",
        "saved cache with linear.H as int64, sums recomputed",
        _cache_edit(_cast(["layers.1.linear.H"], torch.int64)),
        refuse("float32"),
    ),
    Case(
        "cache-ragged-budgets-roundtrip",
        "state",
        "per-head sparse sizes [4, 1]: save, load into a fresh copy of the model, decode (must match)",
        _ragged_roundtrip,
        accept(_same),
    ),
    Case("cache-unused-roundtrip", "state", "a LoLACache that saw no token, saved and loaded, then used like a fresh one", _unused_roundtrip, accept(_same)),
    Case(
        "policy-scores-plus-inf",
        "state",
        "a policy plug-in scoring every candidate +inf",
        _with_policy("plus_inf", _scorer(lambda c: torch.full(c.pos.shape, float("inf")))),
        accept(_sparse_full),
    ),
    Case(
        "policy-scores-minus-inf",
        "state",
        "a policy plug-in scoring every candidate -inf",
        _with_policy("minus_inf", _scorer(lambda c: torch.full(c.pos.shape, float("-inf")))),
        either("minus_inf", check=_sparse_full),
    ),
    Case(
        "policy-scores-int64",
        "state",
        "a policy plug-in returning int64 scores (positions)",
        _with_policy("int_scores", _scorer(lambda c: c.pos.clone())),
        accept(_sparse_full),
    ),
    Case(
        "policy-nan-only-on-empty-slots",
        "state",
        "a policy plug-in returning NaN for empty slots only (ignored by design)",
        _with_policy("nan_empty", _scorer(_nan_on_empty)),
        accept(_sparse_full),
    ),
    Case(
        "policy-scores-a-list",
        "state",
        "a policy plug-in returning a Python list instead of a tensor",
        _with_policy("list_scores", _scorer(lambda c: c.pos.float().tolist())),
        refuse("list_scores"),
    ),
    Case(
        "policy-factory-builds-nothing",
        "state",
        "a policy plug-in whose factory returns object()",
        _with_policy("builds_nothing", _BuildsNothing),
        refuse("builds_nothing"),
    ),
    Case(
        "policy-function-factory",
        "state",
        "a policy registered as a factory function (register's docstring: 'a class or callable')",
        _with_policy("function_factory", _function_factory),
        accept(_sparse_full),
    ),
    Case(
        "schedule-zero-tokens-until-step-padded",
        "state",
        "a schedule plug-in answering 0 tokens until its step, on a left-padded batch",
        _padded_with_schedule("zero_until", 0),
        refuse("schedule"),
        timeout=30,
    ),
    Case(
        "schedule-beyond-period-padded",
        "state",
        "a schedule plug-in answering 7 tokens until its step with period 4, on a left-padded batch",
        _padded_with_schedule("late_step", 7),
        refuse("schedule"),
    ),
]

# -- batch 2: written after them, to check that they hold ------------------------------------------

BATCH_2 = [
    Case(
        "s2-state-on-meta-device",
        "state",
        "a state dict whose window.k lies on the meta device (no data), loaded",
        _load_and_step(LAYER_CFG, lambda sd: sd.update({"window.k": sd["window.k"].to("meta")})),
        refuse("window.k"),
    ),
    Case(
        "s2-state-non-contiguous-views",
        "state",
        "every state tensor a non-contiguous view (transposed back), loaded, six more tokens",
        _load_and_step(LAYER_CFG, _views),
        accept(_same),
    ),
    Case(
        "s2-state-stride-zero-batch",
        "state",
        "a batch-2 state whose tensors are expand() views of one row (stride 0), six more tokens per row",
        _stride_zero_batch,
        accept(_same),
    ),
    Case(
        "s2-state-requires-grad-autograd-on",
        "state",
        "a state whose float tensors require grad, loaded and run with autograd on",
        _requires_grad_with_grad_on,
        accept(_same),
    ),
    Case(
        "s2-state-seen-jumped-ahead",
        "state",
        "'seen' raised by 1000 (positions all still below it): the window no longer holds the newest tokens",
        _load_and_step(LAYER_CFG, lambda sd: sd.update(seen=sd["seen"] + 1000)),
        refuse("seen", check=_harm),
    ),
    Case(
        "s2-state-window-not-the-newest",
        "state",
        "window.pos shifted 16 back (below seen, distinct): a window that does not hold the newest tokens",
        _load_and_step(LAYER_CFG, _window_not_newest),
        either("window.pos", check=_same),
    ),
    Case(
        "s2-state-empty-slot-minus-seven",
        "state",
        "an empty window slot marked -7 instead of -1",
        _load_and_step(
            LAYER_CFG, lambda sd: sd.update({"window.pos": torch.where(sd["window.pos"] == sd["window.pos"].min(), torch.tensor(-7), sd["window.pos"])})
        ),
        either("window.pos", check=_same),
    ),
    Case(
        "s2-cache-fingerprint-edited-other-window",
        "state",
        "saved cache (window 8) whose cache.json fingerprint is rewritten to a window-16 model's, checksum recomputed, loaded there",
        _cache_fingerprint_of({"window": 16}),
        refuse("window"),
    ),
    Case(
        "s2-cache-fingerprint-edited-other-sinks",
        "state",
        "saved cache (2 sinks) whose cache.json fingerprint is rewritten to a 3-sink model's, checksum recomputed, loaded there",
        _cache_fingerprint_of({"sinks": 3}),
        refuse("sinks"),
    ),
    Case(
        "s2-state-all-bfloat16",
        "state",
        "a whole state cast to bfloat16 (keys, values, linear state), loaded into a fresh float32 layer, six more float32 tokens",
        _load_and_step(LAYER_CFG, lambda sd: sd.update({k: t.bfloat16() for k, t in sd.items() if t.is_floating_point()})),
        either("bfloat16|dtype", check=lambda pair, ctx: ensure(float((pair[0] - pair[1]).abs().max()) < 0.1, "outputs far from the float32 state's")),
    ),
    Case("s2-cache-fed-another-batch", "state", "a LoLACache filled with batch 1, then a forward with a batch of 2", _cache_batch_switch, refuse("batch|rows")),
    Case(
        "s2-schedule-answers-float",
        "state",
        "a schedule plug-in answering 2.5 (a float tensor) tokens until its step",
        _with_schedule(lambda seen: torch.full_like(seen, 2.5, dtype=torch.float32)),
        refuse("schedule", check=_described("a fractional token count was accepted")),
    ),
    Case(
        "s2-schedule-answers-python-int",
        "state",
        "a schedule plug-in answering the Python int 4 instead of a tensor",
        _with_schedule(lambda seen: 4),
        refuse("schedule|plugin_schedule|Plugin"),
    ),
    Case(
        "s2-schedule-raises-keyerror",
        "state",
        "a schedule plug-in whose tokens_until_step raises KeyError('bucket')",
        _with_schedule(lambda seen: {}["bucket"]),
        refuse("schedule|plugin_schedule|Plugin"),
    ),
    Case(
        "s2-schedule-period-true",
        "state",
        "a schedule plug-in whose period is True (a bool, not an int)",
        _with_schedule(lambda seen: 4 - seen % 4, period=True),
        refuse("period|schedule"),
    ),
    Case(
        "s2-schedule-period-2pow40",
        "state",
        "a schedule plug-in with period 2**40 (it sizes the window's buffer)",
        _with_schedule(lambda seen: torch.ones_like(seen), period=2**40),
        refuse("period|schedule"),
    ),
    Case(
        "s2-policy-scores-on-meta",
        "state",
        "a policy plug-in returning its scores on the meta device",
        _with_policy("plugin_policy", _scorer(lambda c: torch.zeros(c.pos.shape, device="meta"))),
        refuse("plugin_policy"),
    ),
    Case(
        "s2-policy-scores-bool",
        "state",
        "a policy plug-in returning bool scores (pos > 3)",
        _with_policy("plugin_policy", _scorer(lambda c: c.pos > 3)),
        either("plugin_policy", check=lambda r, ctx: ensure(bool(torch.isfinite(r[0]).all()), "outputs hold inf or NaN")),
    ),
]


# -- batch 3: written before the round-three fixes, to measure them ---------------------------------


def _cfg(**changes) -> lola.LoLAConfig:
    """:data:`LAYER_CFG` (window 8, sparse 4, sinks 2, chunk 4) with ``changes``."""
    return lola.LoLAConfig(**{**LAYER_CFG.model_dump(), **changes})


def _bounded_layer(cfg: lola.LoLAConfig):
    from lola.core.positions import RotaryEmbedding

    return lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2, rotary=RotaryEmbedding.from_theta(10000.0, 8))


def _into(cfg_a: lola.LoLAConfig, cfg_b: lola.LoLAConfig, bounded_b: bool = False):
    """A layer of ``cfg_a``'s state after 40 tokens, loaded into a fresh layer of ``cfg_b``, six more
    tokens; and the six the first layer gives from that state."""

    def run(ctx: Ctx):
        a, _, sd = layer_and_state(cfg_a)
        own = a.new_state()
        own.load_state_dict({k: t.clone() for k, t in sd.items()})
        ref = step(a, own)
        b = _bounded_layer(cfg_b) if bounded_b else layer(cfg_b)
        state = b.new_state()
        state.load_state_dict(sd)
        return step(b, state), ref

    return run


def _pages_into(cfg_a: lola.LoLAConfig, cfg_b: lola.LoLAConfig):
    """Pages a layer of ``cfg_a`` wrote over 40 tokens (row 1 of 3), released, then bound by a
    layer of ``cfg_b`` (the same page shapes) and six more tokens; and the six the writer gives."""

    def run(ctx: Ctx):
        from lola.engine.state_pages import clear_rows

        a, b = layer(cfg_a), layer(cfg_b)
        state = a.new_state()
        layout = state.page_layout(4, a.storage_heads(state), 8, a.feature_dim, torch.float32)
        pages = {key: torch.zeros(3, *shape, dtype=dtype) for key, (shape, dtype) in layout.items()}
        rows = torch.tensor([1])
        clear_rows(pages, rows)
        state.bind_pages(pages, rows, seen=torch.tensor([0]))
        attend(a, 40, state=state)
        state.release_pages()
        mine = a.new_state()
        mine.bind_pages({k: p.clone() for k, p in pages.items()}, rows, seen=torch.tensor([40]))
        ref = step(a, mine)
        other = b.new_state()
        other.bind_pages(pages, rows, seen=torch.tensor([40]))
        return step(b, other), ref

    return run


def _pages_in_inference_mode(ctx: Ctx):
    """Pages allocated, bound and written under torch.inference_mode(); the state then continued outside it."""
    from lola.engine.state_pages import clear_rows

    a = layer()
    with torch.inference_mode():
        state = a.new_state()
        layout = state.page_layout(4, a.storage_heads(state), 8, a.feature_dim, torch.float32)
        pages = {key: torch.zeros(2, *shape, dtype=dtype) for key, (shape, dtype) in layout.items()}
        rows = torch.tensor([0])
        clear_rows(pages, rows)
        state.bind_pages(pages, rows, seen=torch.tensor([0]))
        attend(a, 40, state=state)
    return step(a, state), None


def _state_dict_from_inference_mode(ctx: Ctx):
    """state_dict() taken under torch.inference_mode(), loaded into a fresh state outside it."""
    a = layer()
    with torch.inference_mode():
        _, made = attend(a, 40)
        sd = made.state_dict()
    fresh = a.new_state()
    fresh.load_state_dict(sd)
    _, ref_state = attend(a, 40)
    return step(a, fresh), step(a, ref_state)


def _stepped_inside_between(ctx: Ctx):
    """40 tokens outside, 3 inside torch.inference_mode(), 6 outside again; against all outside."""
    a = layer()
    runs = []
    for inside in (torch.inference_mode, torch.no_grad):
        _, state = attend(a, 40)
        with inside():
            step(a, state, n=3, seed=7)
        runs.append(step(a, state))
    return runs[0], runs[1]


def _cache_saved_in_inference_mode(ctx: Ctx):
    from lola.integrations.transformers import LoLACache, apply_lola

    model, _ = tiny()
    apply_lola(model, lola.LoLAConfig(**CACHE_CFG))
    cache = LoLACache(model)
    with torch.inference_mode():
        model(ids(30, 256), cache=cache)
        cache.save(ctx.path("c"))
    out = continue_with(model, LoLACache.load(ctx.path("c"), model))
    ref = LoLACache(model)
    with torch.no_grad():
        model(ids(30, 256), cache=ref)
    return out, continue_with(model, ref)


def _padded_pair_saved_and_reordered(ctx: Ctx):
    """Two rows (the second left-padded by 4) saved, loaded, rows swapped, four tokens decoded;
    against the same on the cache that was saved."""
    from lola.integrations.transformers import LoLACache, apply_lola

    model, _ = tiny()
    apply_lola(model, lola.LoLAConfig(**CACHE_CFG))
    x = torch.cat([ids(30, 256, seed=1), ids(30, 256, seed=2)])
    mask = torch.ones(2, 30, dtype=torch.long)
    mask[1, :4] = 0
    cache = LoLACache(model)
    with torch.no_grad():
        model(x, attention_mask=mask, cache=cache)
    cache.save(ctx.path("c"))
    loaded = LoLACache.load(ctx.path("c"), model)
    outs = []
    for c in (loaded, cache):
        c.reorder_cache(torch.tensor([1, 0]))
        with torch.no_grad():
            outs.append(torch.cat([model(torch.tensor([[7 + t], [9 + t]]), cache=c).logits for t in range(4)], dim=1))
    return outs[0], outs[1]


def _write_rows_across(cfg_a: lola.LoLAConfig, cfg_b: lola.LoLAConfig):
    """A one-row state of a ``cfg_a`` layer written into row 0 of a two-row state of a ``cfg_b`` layer."""

    def run(ctx: Ctx):
        a, b = layer(cfg_a), layer(cfg_b)
        _, theirs = attend(a, 40)
        _, ours = attend(b, 40, batch=2)
        ours.write_rows(torch.tensor([0]), theirs)
        return attend(b, 6, batch=2, state=ours, seed=5)[0], None

    return run


def _cache_into_other_model(cfg_b: dict):
    """A cache saved by the tiny model with CACHE_CFG, loaded into the same weights with LoLA of ``cfg_b``."""

    def run(ctx: Ctx):
        from lola.integrations.transformers import LoLACache, apply_lola

        saved_cache(ctx.path("c"))
        other, _ = tiny()
        apply_lola(other, lola.LoLAConfig(**{**CACHE_CFG, **cfg_b}))
        return continue_with(other, LoLACache.load(ctx.path("c"), other)).shape

    return run


def _rows_grown(ctx: Ctx):
    """A one-row state grown to three rows by select_rows([0, 0, 0]), then six tokens the same in
    every row: each row against the one-row state."""
    attn, state, sd = layer_and_state()
    one = attn.new_state()
    one.load_state_dict({k: t.clone() for k, t in sd.items()})
    state.select_rows(torch.tensor([0, 0, 0]))
    x = torch.randn(1, 6, 4, 8, generator=torch.Generator().manual_seed(5))
    x3 = x.expand(3, -1, -1, -1).contiguous()
    with torch.no_grad():
        ref, _ = attn(x, x[:, :, :2], x[:, :, :2], state=one)
        out, _ = attn(x3, x3[:, :, :2], x3[:, :, :2], state=state)
    return out, ref.expand(3, -1, -1, -1)


def _layout_refused(pair, ctx) -> None:
    out, ref = pair
    if not bool(torch.isfinite(out).all()):
        raise CaseFailure("a state of another layout was read; the outputs hold inf or NaN")
    if ref is None:
        raise CaseFailure("a state of another layout was read without a word")
    raise CaseFailure(f"a state of another layout was read; the outputs differ from its own layer's by {float((out - ref).abs().max()):.3g}")


BATCH_3 = [
    Case(
        "s3-sparse-per-head-5-3-into-3-5",
        "state",
        "a state of per-head sparse sizes [5, 3] loaded into a layer of [3, 5] (the same total), six more tokens",
        _into(_cfg(sparse_size_per_head=[5, 3]), _cfg(sparse_size_per_head=[3, 5])),
        refuse("head_sizes|sparse", check=_layout_refused),
    ),
    Case(
        "s3-sparse-per-head-4-4-into-uniform-4",
        "state",
        "a state of per-head sparse sizes [4, 4] loaded into a layer of sparse_size 4 (the same layout), six more tokens",
        _into(_cfg(sparse_size_per_head=[4, 4]), _cfg()),
        either("head_sizes|sparse", check=_same),
    ),
    Case(
        "s3-sparse-uniform-4-into-per-head-4-4",
        "state",
        "a state of sparse_size 4 loaded into a layer of per-head sizes [4, 4] (the same layout), six more tokens",
        _into(_cfg(), _cfg(sparse_size_per_head=[4, 4])),
        either("head_sizes|sparse", check=_same),
    ),
    Case(
        "s3-window-per-head-swapped",
        "state",
        "a state of window_per_head [4, 8] loaded into a layer of [8, 4] (the same shapes), six more tokens",
        _into(_cfg(window_per_head=[4, 8]), _cfg(window_per_head=[8, 4])),
        refuse("window", check=_layout_refused),
    ),
    Case(
        "s3-window-8-into-per-head-8-8",
        "state",
        "a state of window 8 loaded into a layer of window_per_head [8, 8] (the same windows), six more tokens",
        _into(_cfg(), _cfg(window_per_head=[8, 8])),
        either("window", check=_same),
    ),
    Case(
        "s3-hedgehog-f8-into-identity-map",
        "state",
        "a state of a hedgehog f=8 layer (16 features) loaded into a hedgehog_identity layer (16 features too), lola_authors mixing",
        _into(_cfg(feature_map="hedgehog", feature_dim=8, mixing="lola_authors"), _cfg(mixing="lola_authors")),
        refuse("feature", check=_layout_refused),
    ),
    Case(
        "s3-hedgehog-f4-into-elu",
        "state",
        "a state of a hedgehog f=4 layer (8 features) loaded into an elu layer (8 features too), lola_authors mixing",
        _into(_cfg(feature_map="hedgehog", feature_dim=4, mixing="lola_authors"), _cfg(feature_map="elu", mixing="lola_authors")),
        refuse("feature", check=_layout_refused),
    ),
    Case(
        "s3-sinks-window-shifted",
        "state",
        "a state of 2 sinks and window 8 loaded into a layer of 4 sinks and window 6 (the same exact tokens)",
        _into(_cfg(), _cfg(sinks=4, window=6)),
        refuse("sinks|window", check=_layout_refused),
    ),
    Case(
        "s3-pages-sinks-window-shifted",
        "state",
        "pages written by a layer of 2 sinks and window 8, bound by a layer of 4 sinks and window 6 (the same page shapes)",
        _pages_into(_cfg(), _cfg(sinks=4, window=6)),
        refuse("sinks|window|layout", check=_layout_refused),
    ),
    Case(
        "s3-pages-window-sparse-traded",
        "state",
        "pages written by a layer of window 8 and sparse 4, bound by a layer of window 4 and sparse 8 (the same page shapes)",
        _pages_into(_cfg(), _cfg(window=4, sparse_size=8)),
        refuse("window|sparse|layout", check=_layout_refused),
    ),
    Case(
        "s3-pages-hedgehog-into-identity-map",
        "state",
        "pages written by a hedgehog f=8 layer, bound by a hedgehog_identity layer (16 features each: the same page shapes)",
        _pages_into(_cfg(feature_map="hedgehog", feature_dim=8, mixing="lola_authors"), _cfg(mixing="lola_authors")),
        refuse("feature", check=_layout_refused),
    ),
    Case(
        "s3-pages-window-per-head-swapped",
        "state",
        "pages written by a layer of window_per_head [4, 8], bound by a layer of [8, 4] (the same page shapes)",
        _pages_into(_cfg(window_per_head=[4, 8]), _cfg(window_per_head=[8, 4])),
        refuse("window|layout", check=_layout_refused),
    ),
    Case(
        "s3-pages-made-in-inference-mode",
        "state",
        "pages allocated and bound under torch.inference_mode(), the state continued outside it",
        _pages_in_inference_mode,
        refuse("inference_mode|inference mode"),
    ),
    Case(
        "s3-state-dict-from-inference-mode",
        "state",
        "a state_dict taken under torch.inference_mode(), loaded into a fresh state outside it, six more tokens",
        _state_dict_from_inference_mode,
        accept(_same),
    ),
    Case(
        "s3-three-tokens-inside-inference-mode",
        "state",
        "a state run outside, three tokens inside torch.inference_mode(), six outside again: as all outside",
        _stepped_inside_between,
        accept(_same),
    ),
    Case(
        "s3-cache-saved-in-inference-mode",
        "state",
        "a LoLACache prefilled and saved under torch.inference_mode(), loaded and continued outside it",
        _cache_saved_in_inference_mode,
        accept(_same),
    ),
    Case(
        "s3-cache-padded-pair-saved-then-reordered",
        "state",
        "a two-row cache (second row left-padded) saved, loaded, rows swapped, four tokens: as the cache that was saved",
        _padded_pair_saved_and_reordered,
        accept(_same),
    ),
    Case(
        "s3-write-rows-of-another-per-head-layout",
        "state",
        "write_rows from a state of per-head sizes [5, 3] into a state of [3, 5] (the same shapes)",
        _write_rows_across(_cfg(sparse_size_per_head=[5, 3]), _cfg(sparse_size_per_head=[3, 5])),
        refuse("head_sizes|sparse|layout|configuration", check=_layout_refused),
    ),
    Case(
        "s3-write-rows-of-another-feature-map",
        "state",
        "write_rows from a hedgehog f=8 layer's state into a hedgehog_identity layer's (the same shapes)",
        _write_rows_across(_cfg(feature_map="hedgehog", feature_dim=8, mixing="lola_authors"), _cfg(mixing="lola_authors")),
        refuse("feature|configuration", check=_layout_refused),
    ),
    Case(
        "s3-cache-into-model-with-layer-override",
        "state",
        "a saved cache loaded into the same weights whose LoLA gives layer 1 a window of 12 (layer_overrides)",
        _cache_into_other_model({"layer_overrides": {1: {"window": 12}}}),
        refuse("config"),
    ),
    Case(
        "s3-cache-into-model-with-bounded-positions",
        "state",
        "a cache saved with absolute positions, loaded into the same weights with positions='bounded'",
        _cache_into_other_model({"positions": "bounded"}),
        refuse("config|positions"),
    ),
    Case(
        "s3-rows-grown-by-select-rows",
        "state",
        "a one-row state grown to three by select_rows([0, 0, 0]), six same tokens per row: each row as the one-row state",
        _rows_grown,
        accept(_same),
    ),
    Case(
        "s3-absolute-state-into-bounded-layer",
        "state",
        "a state of an absolute-positions layer loaded into the same layer with bounded positions (limits 100, beyond the 46 tokens)",
        _into(_cfg(), _cfg(positions="bounded", exact_distance=100, state_positions=100), bounded_b=True),
        either("positions", check=_same),
    ),
]

CASES = [*in_batch(1, BATCH_1), *in_batch(2, BATCH_2), *in_batch(3, BATCH_3)]
