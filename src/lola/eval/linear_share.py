"""How much of each LoLA layer's output comes from the linear state: a diagnostic.

Every mixing rule writes a layer's output as ``α · (linear state's read) + (1 − α) · (exact
tokens' softmax)`` (:func:`lola.core.linear_share`). ``α`` near 0 means the exact tokens
swamp the state (LoLA would be ``softmax_only`` in disguise); near 1, the state stands in for
everything (the sparse cache would be ignored). ``lola perplexity`` reports the mean ``α`` per
layer for each method it measures::

    with LinearShareMeter(model._lola.modules) as meter:
        model(ids, cache=LoLACache(model))
    meter.per_layer()    # {layer: mean α over heads and real tokens}
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from lola.layer import LoLAAttention, observe_linear_share

__all__ = ["LinearShareMeter"]


class LinearShareMeter:
    """Accumulates the linear state's share ``α`` of the outputs of some LoLA layers.

    Args:
        layers: ``{layer index: LoLAAttention}`` to watch (e.g. ``model._lola.modules`` after
            :func:`~lola.integrations.transformers.apply_lola`); calls of other layers are
            ignored.

    Use as a context manager (calls in the current thread are measured while it is open); it
    can be entered several times and keeps accumulating.
    """

    def __init__(self, layers: Mapping[int, LoLAAttention]) -> None:
        self._index = {id(module): i for i, module in layers.items()}
        self._sums: dict[int, torch.Tensor] = {}  # layer -> [H] summed α over real tokens
        self._counts: dict[int, int] = {}
        self._context = None

    def _record(self, layer: LoLAAttention, share: torch.Tensor, valid: torch.Tensor) -> None:
        i = self._index.get(id(layer))
        if i is None:
            return
        mask = valid[:, None, :].to(share.dtype)  # [B, 1, T]
        heads = (share * mask).sum(dim=(0, 2)).double().cpu()  # [H]
        self._sums[i] = self._sums[i] + heads if i in self._sums else heads
        self._counts[i] = self._counts.get(i, 0) + int(valid.sum())

    def __enter__(self) -> "LinearShareMeter":
        self._context = observe_linear_share(self._record)
        self._context.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        context, self._context = self._context, None
        context.__exit__(*exc)

    def per_head(self) -> dict[int, list[float]]:
        """``{layer: [mean α of each head]}`` over the real tokens seen so far."""
        return {i: (self._sums[i] / max(self._counts[i], 1)).tolist() for i in sorted(self._sums)}

    def per_layer(self) -> dict[int, float]:
        """``{layer: mean α over its heads}``."""
        return {i: sum(heads) / len(heads) for i, heads in self.per_head().items()}

    def mean(self) -> float:
        """Mean ``α`` over every watched layer that ran (``nan`` if none did)."""
        layers = self.per_layer()
        return sum(layers.values()) / len(layers) if layers else float("nan")
