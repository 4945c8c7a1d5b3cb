"""LoLACache: a transformers ``Cache`` whose LoLA layers hold constant-size state."""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

from lola.composer import LoLAMemory
from lola.integrations.transformers.attention import announce

__all__ = ["LoLACache", "LoLACacheLayer"]

_FORMAT = "lola-cache/1"


class LoLACacheLayer(CacheLayerMixin):
    """One decoder layer's LoLA state (:class:`lola.LoLAMemory`), inside a transformers cache.

    ``update`` returns only the new keys and values (the attention function writes them into
    the state); ``get_seq_length`` is the number of columns seen, padding included, so
    positions and RoPE stay right.
    """

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self) -> None:
        super().__init__()
        self.state: LoLAMemory | None = None
        self.cumulative_length = 0
        self.pending_key: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Record ``key_states: [B, H_kv, T, D]`` as pending for this layer's attention call."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        self.pending_key = key_states
        announce(self)
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # The standard full mask: its last query_length columns carry the segment's padding,
        # and layers left as full attention can use it unchanged.
        return self.cumulative_length + query_length, 0

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return -1

    def nbytes(self) -> int:
        """Bytes held by this layer's state (constant once allocated)."""
        return 0 if self.state is None else self.state.nbytes()

    def reset(self) -> None:
        self.state = None
        self.cumulative_length = 0
        self.pending_key = None
        self.is_initialized = False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the batch (beam search): every state tensor is indexed along its batch axis."""
        if self.state is None or not self.state.allocated:
            return
        sd = self.state.state_dict()
        self.state.load_state_dict({k: t.index_select(0, beam_idx.to(t.device)) for k, t in sd.items()})

    def crop(self, max_length: int) -> None:
        raise NotImplementedError(
            "a LoLA cache cannot be cropped: evicted tokens are summed into the linear state and cannot be taken out "
            "(assisted generation and cache cropping are not supported)"
        )

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.state is not None and self.state.allocated:
            self.state.load_state_dict({k: t.repeat_interleave(repeats, dim=0) for k, t in self.state.state_dict().items()})

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.state is not None and self.state.allocated:
            self.state.load_state_dict({k: t[indices] for k, t in self.state.state_dict().items()})

    def offload(self) -> None:  # the state is small; it stays where its layer runs
        return None

    def prefetch(self) -> None:
        return None


class LoLACache(Cache):
    """A transformers ``Cache`` for a model prepared with :func:`apply_lola`.

    One :class:`LoLACacheLayer` per LoLA layer and a stock ``DynamicLayer`` per layer left as
    full attention. Pass it to ``model.generate(..., past_key_values=LoLACache(model))`` or to
    a forward call; its memory stops growing once each layer's budget is full (full-attention
    layers, if any, still grow).

    Args:
        model: a model prepared with :func:`~lola.integrations.transformers.apply_lola`.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        info = getattr(model, "_lola", None)
        if info is None:
            raise ValueError("LoLACache needs a model prepared with lola.integrations.transformers.apply_lola(model, config)")
        self.fingerprint = dict(info["fingerprint"])
        full = set(info["full_attention_layers"])
        layers = [DynamicLayer() if i in full else LoLACacheLayer() for i in range(info["num_layers"])]
        super().__init__(layers=layers)
        self._lola_modules = info["modules"]

    def nbytes(self) -> int:
        """Bytes held: LoLA states plus the K/V of any full-attention layers."""
        total = 0
        for layer in self.layers:
            if isinstance(layer, LoLACacheLayer):
                total += layer.nbytes()
            elif getattr(layer, "keys", None) is not None and layer.keys.numel():
                total += layer.keys.numel() * layer.keys.element_size() * 2
        return total

    # -- persistence ------------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> None:
        """Write the cache to ``directory`` (``cache.safetensors`` + ``cache.json``).

        Only LoLA layers can be saved; a cache with full-attention layers raises.
        """
        from safetensors.torch import save_file

        tensors: dict[str, torch.Tensor] = {}
        lengths = []
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, LoLACacheLayer):
                raise NotImplementedError(f"layer {i} is a full-attention layer; saving such caches is not supported")
            lengths.append(layer.cumulative_length)
            if layer.state is not None:
                tensors.update({f"layers.{i}.{k}": t.detach().contiguous().cpu() for k, t in layer.state.state_dict().items()})
        os.makedirs(directory, exist_ok=True)
        save_file(tensors, os.path.join(directory, "cache.safetensors"))
        meta = {"format": _FORMAT, "fingerprint": self.fingerprint, "cumulative_lengths": lengths}
        with open(os.path.join(directory, "cache.json"), "w") as f:
            json.dump(meta, f, indent=2)

    @classmethod
    def load(cls, directory: str | os.PathLike, model: torch.nn.Module) -> "LoLACache":
        """Read a cache written by :meth:`save` for ``model`` (same model and LoLA config, or ``ValueError``)."""
        from safetensors.torch import load_file

        with open(os.path.join(directory, "cache.json")) as f:
            meta = json.load(f)
        if meta.get("format") != _FORMAT:
            raise ValueError(f"{directory} does not hold a lola cache (format {meta.get('format')!r}, expected {_FORMAT!r})")
        cache = cls(model)
        if meta["fingerprint"] != cache.fingerprint:
            diff = {k: (meta["fingerprint"].get(k), v) for k, v in cache.fingerprint.items() if meta["fingerprint"].get(k) != v}
            raise ValueError(f"the cache in {directory} was saved for another model or LoLA config: (saved, this model) differ in {diff}")
        tensors = load_file(os.path.join(directory, "cache.safetensors"))
        for i, layer in enumerate(cache.layers):
            layer.cumulative_length = int(meta["cumulative_lengths"][i])
            part = {k[len(f"layers.{i}.") :]: t for k, t in tensors.items() if k.startswith(f"layers.{i}.")}
            if part:
                module = cache._lola_modules[i]
                device = next(module.parameters()).device
                state = module.new_state()
                state.load_state_dict({k: t.to(device) for k, t in part.items()})
                layer.state = state
                layer.is_initialized = True
        return cache
