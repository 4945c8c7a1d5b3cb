"""A layer's share of the heads: what a tensor-parallel rank computes.

Megatron-style tensor parallelism gives each rank whole query heads (and the K/V heads they
read): a LoLA layer's heads are independent (each storage head keeps its own exact slots, each
query head its own linear state and feature map), so a rank's share is a LoLA layer of those
heads with the per-head sizes, parameters and policy head indices of the share.
:func:`lola.compose` builds it (``heads=(first, end)``); :func:`head_axes` names the axis of each
per-head parameter, for loading a rank's slice of a full checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from lola.config import LoLAConfig

__all__ = ["HeadShare", "head_axes", "head_share"]


@dataclass(frozen=True)
class HeadShare:
    """Query heads ``[first, end)`` of a layer with ``num_heads`` query heads and
    ``num_kv_heads`` K/V heads, and the storage heads ``[storage_first, storage_end)`` they keep."""

    first: int
    end: int
    num_heads: int
    num_kv_heads: int
    storage_first: int
    storage_end: int

    @property
    def heads(self) -> int:
        """Query heads of the share."""
        return self.end - self.first

    @property
    def kv_heads(self) -> int:
        """K/V heads of the share."""
        return self.heads * self.num_kv_heads // self.num_heads

    def config(self, cfg: LoLAConfig) -> LoLAConfig:
        """``cfg`` (one layer's) with its per-storage-head sizes cut to the share's."""
        update = {}
        for field in ("window_per_head", "sparse_size_per_head"):
            sizes = getattr(cfg, field)
            if sizes is not None:
                update[field] = list(sizes[self.storage_first : self.storage_end])
        return cfg.model_copy(update=update) if update else cfg


def head_share(heads: object, num_heads: int, num_kv_heads: int, gqa_storage: str) -> HeadShare:
    """Check ``heads = (first, end)`` against the layer's geometry: whole groups of the query
    heads that read one K/V head (a rank never holds part of a group: the group's scores are
    reduced over its query heads, and its K/V head is stored once).

    Raises:
        TypeError: ``heads`` is not a pair of ints.
        ValueError: out of range, empty, or not whole groups (naming the group size).
    """
    if not (isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(h, int) and not isinstance(h, bool) for h in heads)):
        raise TypeError(f"heads must be a pair of ints (first, end), got {heads!r}")
    first, end = heads
    if not 0 <= first < end <= num_heads:
        raise ValueError(f"heads must satisfy 0 <= first < end <= num_heads ({num_heads}), got {heads}")
    group = num_heads // num_kv_heads
    if first % group or end % group:
        raise ValueError(
            f"heads {heads} split a group of {group} query heads that read one K/V head: give whole groups "
            f"(multiples of {group}; tensor parallelism needs num_kv_heads ({num_kv_heads}) divisible by the number of ranks)"
        )
    if gqa_storage == "kv_head":
        return HeadShare(first, end, num_heads, num_kv_heads, first // group, end // group)
    return HeadShare(first, end, num_heads, num_kv_heads, first, end)


def head_axes(module: nn.Module) -> dict[str, int]:
    """``{parameter name: the axis of its heads}`` of a :class:`lola.LoLAAttention`: the layer's
    ``window_factors`` (axis 1) and its feature maps' per-head parameters (declared by each map
    as ``head_axes``, e.g. Hedgehog's ``mlp.layer`` on axis 0).

    Raises:
        ValueError: a parameter whose head axis nobody declared (a rank could not load its
            slice of it), named.
    """
    axes = {"window_factors": 1}
    for prefix in ("feature_map_q", "feature_map_k"):
        declared = getattr(getattr(module, prefix), "head_axes", {})
        axes.update({f"{prefix}.{name}": axis for name, axis in declared.items()})
    undeclared = [name for name, _ in module.named_parameters() if name not in axes]
    if undeclared:
        raise ValueError(f"parameters {undeclared} declare no head axis (a feature map's head_axes): a share of the heads cannot be cut from them")
    return {name: axes[name] for name, _ in module.named_parameters()}
