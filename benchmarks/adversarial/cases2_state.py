"""Batch 2, class 2: state and cache integrity.

States with odd storage (non-contiguous, stride-0, requiring grad, on the ``meta`` device), a
``seen`` count that jumped ahead of the tokens held, saved caches whose ``cache.json`` was
edited with its checksum recomputed (judged by whether the values are still validated), a cache
fed another batch, and schedule and policy plug-ins answering with the wrong kind of value
(floats, Python ints, exceptions, absurd periods, tensors on another device).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from common import CACHE_CFG, continue_with, edit_cache, ids, layer_and_state, policy, saved_cache, step, tiny
from harness import Case, CaseFailure, Ctx, accept, either, ensure, refuse

import lola


def _same(pair, ctx) -> None:
    out, ref = pair
    ensure(bool(torch.isfinite(out).all()), "accepted; outputs hold inf or NaN")
    diff = float((out.float() - ref.float()).abs().max())
    ensure(diff <= 1e-5, f"accepted; outputs differ from the unedited state's by {diff:.3g}")


def _harm(pair, ctx) -> None:
    out, ref = pair
    ensure(bool(torch.isfinite(out).all()), "nothing flagged it; the outputs hold inf or NaN")
    diff = float((out.float() - ref.float()).abs().max())
    raise CaseFailure(f"nothing flagged it; outputs differ from the unedited state's by {diff:.3g}")


def _edited(edit, batch_rows: int | None = None):
    """A layer's state after 40 tokens, edited by ``edit(sd)``, loaded into a fresh state and run
    six more tokens; returns those outputs and the unedited state's."""

    def run(ctx: Ctx):
        attn, _, sd = layer_and_state()
        ref_state = attn.new_state()
        ref_state.load_state_dict({k: t.clone() for k, t in sd.items()})
        ref = step(attn, ref_state)
        edit(sd)
        state = attn.new_state()
        state.load_state_dict(sd)
        return step(attn, state), ref

    return run


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
        edit_cache(ctx.path("c"), change_meta=lambda m: m.update(fingerprint=fingerprint))
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


# -- schedule and policy plug-ins ------------------------------------------------------------------


def _with_schedule(until, period=4, batch: int = 1):
    """A layer whose schedule plug-in (``period``) answers ``until(seen)``, over 40 tokens then one."""

    def run(ctx: Ctx):
        from lola.schedules import register, unregister

        @dataclass(frozen=True)
        class Plugin:
            period: int

            def tokens_until_step(self, seen):
                return until(seen)

        register("plugin_schedule", lambda chunk: Plugin(period), overwrite=True)
        try:
            cfg = lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4, schedule="plugin_schedule")
            attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
            x = torch.randn(batch, 40, 4, 8, generator=torch.Generator().manual_seed(0))
            with torch.no_grad():
                o, state = attn(x, x[:, :, :2], x[:, :, :2])
                o2, _ = attn(x[:, :1], x[:, :1, :2], x[:, :1, :2], state=state)
            return o
        finally:
            unregister("plugin_schedule")

    return run


def _with_policy(score):
    def run(ctx: Ctx):
        @dataclass(frozen=True)
        class Plugin:
            needs_attention = False

            def score(self, candidates, c):
                return score(candidates)

        with policy("plugin_policy", Plugin):
            cfg = lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4, policy="plugin_policy")
            attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
            x = torch.randn(1, 40, 4, 8, generator=torch.Generator().manual_seed(0))
            with torch.no_grad():
                o, _ = attn(x, x[:, :, :2], x[:, :, :2])
            return o

    return run


def _described(what: str):
    def check(result, ctx):
        raise CaseFailure(what)

    return check


CASES = [
    Case(
        "s2-state-on-meta-device",
        "state",
        "a state dict whose window.k lies on the meta device (no data), loaded",
        _edited(lambda sd: sd.update({"window.k": sd["window.k"].to("meta")})),
        refuse("window.k"),
    ),
    Case(
        "s2-state-non-contiguous-views",
        "state",
        "every state tensor a non-contiguous view (transposed back), loaded, six more tokens",
        _edited(_views),
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
        _edited(lambda sd: sd.update(seen=sd["seen"] + 1000)),
        refuse("seen", check=_harm),
    ),
    Case(
        "s2-state-window-not-the-newest",
        "state",
        "window.pos shifted 16 back (below seen, distinct): a window that does not hold the newest tokens",
        _edited(_window_not_newest),
        either("window.pos", check=_same),
    ),
    Case(
        "s2-state-empty-slot-minus-seven",
        "state",
        "an empty window slot marked -7 instead of -1",
        _edited(lambda sd: sd.update({"window.pos": torch.where(sd["window.pos"] == sd["window.pos"].min(), torch.tensor(-7), sd["window.pos"])})),
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
        _edited(lambda sd: sd.update({k: t.bfloat16() for k, t in sd.items() if t.is_floating_point()})),
        either("bfloat16|dtype", check=lambda pair, ctx: ensure(float((pair[0] - pair[1]).abs().max()) < 0.1, "outputs far from the float32 state's")),
    ),
    Case(
        "s2-cache-fed-another-batch",
        "state",
        "a LoLACache filled with batch 1, then a forward with a batch of 2",
        _cache_batch_switch,
        refuse("batch|rows"),
    ),
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
        _with_policy(lambda c: torch.zeros(c.pos.shape, device="meta")),
        refuse("plugin_policy"),
    ),
    Case(
        "s2-policy-scores-bool",
        "state",
        "a policy plug-in returning bool scores (pos > 3)",
        _with_policy(lambda c: c.pos > 3),
        either("plugin_policy", check=lambda o, ctx: ensure(bool(torch.isfinite(o).all()), "outputs hold inf or NaN")),
    ),
]
