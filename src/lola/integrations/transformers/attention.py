"""The ``"lola"`` attention function and mask registered with transformers.

transformers calls ``cache.update(k, v, layer_idx)`` right before the attention function of
the same layer, and the attention function never sees the cache. A :class:`LoLACacheLayer`
therefore announces itself in a context variable during ``update``; the attention function
takes it from there, checking that the layer was updated with the very key tensor it receives
(so a stale announcement, e.g. with ``use_cache=False``, is never used).
"""

from __future__ import annotations

import weakref
from contextvars import ContextVar
from typing import Any, Callable, Protocol

import torch

__all__ = ["ATTENTION_NAME", "lola_attention_forward", "register_attention", "segment_padding_mask"]

ATTENTION_NAME = "lola"


class AnnouncedLayer(Protocol):
    """What the attention function reads of the cache layer that announced itself (a
    :class:`~lola.integrations.transformers.cache.LoLACacheLayer`)."""

    pending_key: torch.Tensor | None  # the key tensor of the update that announced it
    state: Any  # the layer's LoLAMemory, or None before its first call
    owner: Callable[[], object] | None  # a weak reference to the attention module it serves


_ANNOUNCED: ContextVar[AnnouncedLayer | None] = ContextVar("lola_announced_cache_layer", default=None)
# The last 4D mask read, its segment length and the padding mask found in it.
_LAST_MASK: ContextVar[tuple | None] = ContextVar("lola_last_attention_mask", default=None)
# The last position_ids found right (a copy), the padding mask and the counts they matched.
_LAST_POSITIONS: ContextVar[tuple | None] = ContextVar("lola_last_position_ids", default=None)


def announce(layer: AnnouncedLayer) -> None:
    """Called by :meth:`LoLACacheLayer.update`: the next LoLA attention call may use ``layer``."""
    _ANNOUNCED.set(layer)


# The 4D masks lola's mask function built from a 2D padding mask: causal + padding by
# construction. Any other 4D mask reached the layers from the caller and is checked.
_BUILT: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()  # by id: tensors compare by value


# Configs of models whose every layer is a LoLA one (:func:`lola.apply_lola` files them):
# their layers read only whether each token is real, so their mask need not be built whole.
_PADDING_ONLY: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()


def read_padding_only(config: object, every_layer: bool) -> None:
    """File (or unfile) ``config`` as a model's whose layers are all LoLA ones (:func:`lola_mask`)."""
    if every_layer:
        _PADDING_ONLY[id(config)] = config
    elif _PADDING_ONLY.get(id(config)) is config:
        del _PADDING_ONLY[id(config)]


def lola_mask(*args, **kwargs):
    """transformers' ``sdpa_mask``, remembering the causal + padding masks it builds (see
    :data:`_BUILT`); for a model whose every layer is a LoLA one, a ``[B, 1, q, kv]`` view of
    the padding mask instead (no ``B × q × kv`` tensor: 16 GiB for four rows of 64K tokens).

    The view says, at ``[b, 0, i, j]``, whether key ``j`` of row ``b`` is a real token; LoLA
    layers read its diagonal only (whether each query is real) and are causal by construction.
    Any other pattern (packed sequences found in ``position_ids``, a custom mask function) is
    built whole by ``sdpa_mask`` and checked by the layers like a caller's mask.
    """
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    plain = not args and kwargs.get("mask_function", causal_mask_function) is causal_mask_function and kwargs.get("local_size") is None
    config = kwargs.get("config")
    if plain and config is not None and _PADDING_ONLY.get(id(config)) is config:
        attention_mask = kwargs.get("attention_mask")
        if attention_mask is None:
            return None
        kv_length, kv_offset = kwargs["kv_length"], kwargs.get("kv_offset", 0)
        # (as sdpa_mask reads it: columns past the 2-D mask's end are padding)
        real = torch.nn.functional.pad(attention_mask.bool(), (0, max(0, kv_offset + kv_length - attention_mask.shape[-1])))
        real = real[:, kv_offset : kv_offset + kv_length]
        q_length = kwargs["q_length"]
        segment = real[:, kv_length - q_length :]  # the segment's real tokens (the diagonal)
        every, segment_every = torch.stack([real.all(), segment.all()]).tolist()  # the forward's one read
        if every:
            return None
        mask = real[:, None, None, :].expand(real.shape[0], 1, q_length, kv_length)
        # what segment_padding_mask would find on the diagonal, told now (no second read)
        _LAST_MASK.set((weakref.ref(mask), q_length, None if segment_every else segment))
    else:
        mask = sdpa_mask(*args, **kwargs)
    if plain and isinstance(mask, torch.Tensor):
        _BUILT[id(mask)] = mask
    return mask


def check_causal_with_padding(attention_mask: torch.Tensor, q_len: int) -> None:
    """Refuse a 4D mask given by the caller that is more than causal attention over the real
    tokens: LoLA's memories hold one sequence per row, so packed sequences (a block-diagonal
    mask) or other patterns cannot be honoured, and reading only the padding would let the
    sequences attend to each other.

    For every real query (one that may attend to itself), the keys it may attend to must be
    exactly the real keys at or before it, the real keys being those some real query attends to.

    Raises:
        ValueError: naming ``attention_mask`` and what is supported.
    """
    if attention_mask.is_floating_point():
        # additive: 0 where a query may attend, a large negative number (or -inf) elsewhere; a
        # float mask of 1s and 0s would read inverted
        bad = (attention_mask != 0) & ~(attention_mask <= -1e4)
        if bool(bad.any()):
            value = float(attention_mask[bad][0])
            raise ValueError(
                f"attention_mask: a float 4-D mask is additive (0 where a query may attend, a large negative number or -inf elsewhere); "
                f"it holds {value:g}: pass a bool mask (True = attend) or an additive one"
            )
    allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0  # [B, h, q, kv]
    if allowed.shape[1] != 1 and not bool((allowed == allowed[:, :1]).all()):
        raise ValueError("attention_mask: a 4-D mask that differs between heads is not supported by LoLA layers; pass a 2-D padding mask")
    allowed = allowed[:, 0]  # [B, q, kv]
    kv_len = allowed.shape[-1]
    columns = kv_len - q_len + torch.arange(q_len, device=allowed.device)  # each query's own key column
    real_query = allowed[:, torch.arange(q_len, device=allowed.device), columns]  # [B, q]
    causal = torch.arange(kv_len, device=allowed.device)[None, :] <= columns[:, None]  # [q, kv]
    real_key = (allowed & real_query[..., None]).any(dim=1)  # [B, kv]
    expected = causal[None] & real_key[:, None, :]
    wrong = (allowed != expected) & real_query[..., None]
    if bool(wrong.any()):
        b, i, j = (int(x) for x in wrong.nonzero()[0])
        raise ValueError(
            f"attention_mask: the 4-D mask is more than causal attention over the real tokens (row {b}: query {i} "
            f"{'may' if bool(allowed[b, i, j]) else 'may not'} attend to key {j}), e.g. packed sequences; LoLA layers hold one "
            "sequence per row and read causal attention with padding only: pass a 2-D padding mask, one sequence per row"
        )


def segment_padding_mask(attention_mask: torch.Tensor | None, q_len: int) -> torch.Tensor | None:
    """``[B, q_len]`` bool real-token mask of the current segment, from transformers' 4D mask
    (``None`` when every token of the segment is real).

    The mask is ``[B, 1, q_len, kv_len]`` (True or 0.0 = may attend), the current segment being
    its last ``q_len`` key columns; a token is real iff it may attend to itself (padding masks
    key columns, so the diagonal carries it). ``None`` means no padding.
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() != 4:
        raise ValueError(f"attention_mask must be [B, 1, q_len, kv_len], got shape {tuple(attention_mask.shape)}")
    # transformers builds one mask per forward and hands it to every layer: it is read back
    # (whether any token is padding) once per forward, not once per layer.
    last = _LAST_MASK.get()
    if last is not None and last[0]() is attention_mask and last[1] == q_len:
        return last[2]
    if _BUILT.get(id(attention_mask)) is not attention_mask:
        check_causal_with_padding(attention_mask, q_len)
    kv_len = attention_mask.shape[-1]
    i = torch.arange(q_len, device=attention_mask.device)
    diag = attention_mask[:, 0, i, kv_len - q_len + i]
    mask = diag if diag.dtype == torch.bool else diag == 0
    found = None if bool(mask.all()) else mask
    _LAST_MASK.set((weakref.ref(attention_mask), q_len, found))
    return found


def lola_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: LoLA for layers with a ``module.lola``, SDPA otherwise.

    Args:
        module: the model's attention module (``layer_idx``; ``lola`` = its
            :class:`lola.LoLAAttention` when LoLA was applied to this layer).
        query: ``[B, H, q_len, D]``; key, value: ``[B, H_kv, q_len, D]`` (the cache layer
            returns only the new tokens).
        attention_mask: ``[B, 1, q_len, kv_len]`` from the registered mask function, or ``None``.

    Returns:
        ``(attn_output [B, q_len, H, D], None)``.
    """
    lola_attn = getattr(module, "lola", None)
    if lola_attn is None:  # a layer left as full attention
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        layer = _ANNOUNCED.get()
        if layer is not None and layer.pending_key is key:
            # Its cache layer is a LoLA one (apply_lola made it LoLA; its `lola` was deleted
            # since): that cache returns only the new keys, so SDPA would read them alone.
            _ANNOUNCED.set(None)
            raise ValueError(
                f"layer {getattr(module, 'layer_idx', '?')} has a LoLA cache layer but no LoLA module (its `lola` was removed after apply_lola): "
                "it would attend over the new tokens only; call remove_lola(model) and apply_lola again"
            )

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    if dropout:
        raise ValueError("LoLA attention does not implement attention dropout; call model.eval() or set attention_dropout=0")
    if key.shape[2] != query.shape[2]:
        raise ValueError(
            f"LoLA layer {getattr(module, 'layer_idx', '?')} got keys for {key.shape[2]} tokens with {query.shape[2]} queries: "
            "the model was called with a cache that keeps past keys (e.g. a DynamicCache); a LoLA model needs "
            "cache=LoLACache(model) (generate() builds one when given no cache)"
        )
    layer = _ANNOUNCED.get()
    if layer is not None and layer.pending_key is not key:
        layer = None  # announced for another call: this forward runs without a cache
    if layer is not None and getattr(layer, "owner", None) is not None and layer.owner() is not lola_attn:
        _ANNOUNCED.set(None)
        raise ValueError(
            f"LoLA layer {getattr(module, 'layer_idx', '?')} was given another model's LoLACache (or one from before LoLA was re-applied): "
            "build one with LoLACache(model)"
        )
    state = None if layer is None else layer.state
    q_len = query.shape[2]
    padding = segment_padding_mask(attention_mask, q_len)
    if lola_attn.positions is not None:
        check_rotated_positions(kwargs.get("position_ids"), state, padding, getattr(module, "layer_idx", "?"))
    o, state = lola_attn(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), state=state, padding_mask=padding)
    if layer is not None:
        layer.state = state
        layer.pending_key = None
        _ANNOUNCED.set(None)
    return o, None


def check_rotated_positions(position_ids: torch.Tensor | None, state: Any, padding: torch.Tensor | None, layer: object) -> None:
    """Bounded positions re-rotate keys from the positions the model rotated them at, taken to
    be each token's count of real tokens before it in its row (what ``generate()`` feeds):
    refuse ``position_ids [B, q_len]`` that say otherwise (e.g. a left-padded batch called
    without positions derived from its mask). Padding entries are not compared."""
    if position_ids is None:
        return
    from lola.core.checks import reads_back, require

    b, t = padding.shape if padding is not None else (position_ids.shape[0], position_ids.shape[-1])
    seen = state.seen if state is not None and getattr(state, "allocated", False) else torch.zeros(b, dtype=torch.long, device=position_ids.device)
    # transformers hands one position_ids tensor to every layer of a forward, whose states
    # have seen the same counts: on a host device the same values, padding and counts are
    # compared once per forward, not per layer.
    counts = tuple(seen.tolist()) if reads_back(seen.device) else None
    last = _LAST_POSITIONS.get()
    if counts is not None and last is not None and last[1] is padding and last[2] == counts and _same_tensor(last[0], position_ids):
        return
    steps = padding.long().cumsum(dim=1) if padding is not None else torch.arange(1, t + 1, device=position_ids.device)[None, :]
    expected = seen.to(position_ids.device)[:, None] + steps - 1
    same = position_ids.expand(b, t) == expected
    if padding is not None:
        same = same | ~padding
    message = (
        f"LoLA layer {layer} bounds its positions and takes each token's position to be its row's count of real tokens before it; "
        "the model was called with other position_ids (derive them from the attention mask, as generate() does)"
    )
    if not require(same.all(), message):
        raise ValueError(message)
    if counts is not None:
        _LAST_POSITIONS.set((position_ids.clone(), padding, counts))


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)


def register_attention() -> None:
    """Register the ``"lola"`` attention function and its mask function with transformers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, lola_attention_forward)
    # Without a mask function of the same name transformers passes attention_mask=None,
    # and left-padded batches would be silently wrong.
    AttentionMaskInterface.register(ATTENTION_NAME, lola_mask)
