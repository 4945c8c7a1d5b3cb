"""LoLACache: a transformers ``Cache`` whose LoLA layers hold constant-size state."""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

from lola.checksums import sha256_file
from lola.composer import LoLAMemory
from lola.integrations.transformers.applied import applied, weights_digest
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
        self.state.select_rows(beam_idx)

    def crop(self, max_length: int) -> None:
        raise NotImplementedError(
            "a LoLA cache cannot be cropped: evicted tokens are summed into the linear state and cannot be taken out "
            "(assisted generation and cache cropping are not supported)"
        )

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.state is not None and self.state.allocated:
            self.state.select_rows(torch.arange(self.state.batch_size).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.state is not None and self.state.allocated:
            index = torch.as_tensor(indices)
            self.state.select_rows(index.nonzero().flatten() if index.dtype == torch.bool else index.long().flatten())

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
        info = applied(model, needed_by="LoLACache")
        self.fingerprint = dict(info.fingerprint)
        full = set(info.full_attention_layers)
        layers = [DynamicLayer() if i in full else LoLACacheLayer() for i in range(info.num_layers)]
        super().__init__(layers=layers)
        self._lola_modules = info.modules
        self._applied = info
        self._model = weakref.ref(model)

    def check_model(self, model: torch.nn.Module | None = None) -> None:
        """Refuse use with a model that is not the one this cache was built for, patched as it was then.

        A cache outlives :func:`remove_lola` (or a new :func:`apply_lola`) only as a stale object:
        its states belong to layers that no longer run, so using it would silently change tokens.
        """
        own = self._model()
        if model is not None and own is not model:
            raise ValueError("this LoLACache was built for another model: build one with LoLACache(model)")
        if own is None or getattr(own, "_lola", None) is not self._applied:
            raise ValueError("this LoLACache is stale: LoLA was removed from (or re-applied to) its model since it was built; build a new LoLACache(model)")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx == 0:  # once per forward: the model must still be patched as it was
            self.check_model()
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

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

        ``cache.json`` records the model's fingerprint (shape, LoLA config, a digest of its
        weights and feature maps), the lengths seen and the sha256 of ``cache.safetensors``.
        Only LoLA layers can be saved; a cache with full-attention layers raises.
        """
        from safetensors.torch import save_file

        self.check_model()
        tensors: dict[str, torch.Tensor] = {}
        lengths = []
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, LoLACacheLayer):
                raise NotImplementedError(f"layer {i} is a full-attention layer; saving such caches is not supported")
            lengths.append(layer.cumulative_length)
            if layer.state is not None:
                tensors.update({f"layers.{i}.{k}": t.detach().contiguous().cpu() for k, t in layer.state.state_dict().items()})
        os.makedirs(directory, exist_ok=True)
        weights = os.path.join(directory, "cache.safetensors")
        save_file(tensors, weights)
        meta = {
            "format": _FORMAT,
            "fingerprint": {**self.fingerprint, "weights": weights_digest(self._model())},
            "cumulative_lengths": lengths,
            "sha256": sha256_file(weights),
        }
        meta["checksum"] = _meta_checksum(meta)
        with open(os.path.join(directory, "cache.json"), "w") as f:
            json.dump(meta, f, indent=2)

    @classmethod
    def load(cls, directory: str | os.PathLike, model: torch.nn.Module) -> "LoLACache":
        """Read a cache written by :meth:`save` for ``model``.

        Raises ``ValueError`` (naming the file) if the folder does not hold a lola cache, a file
        is damaged or edited, or the cache was saved for another model, other weights or
        feature maps, or another LoLA config.
        """
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        cache = cls(model)
        meta_path, weights = os.path.join(directory, "cache.json"), os.path.join(directory, "cache.safetensors")
        for path in (meta_path, weights):
            if not os.path.isfile(path):
                raise ValueError(f"{directory} does not hold a lola cache: {path} is missing")
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{meta_path} is not valid JSON ({e}); was it written by LoLACache.save?") from None
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else None
            raise ValueError(f"{directory} does not hold a lola cache (format {found!r}, expected {_FORMAT!r})")
        if meta.get("checksum") != _meta_checksum(meta):
            raise ValueError(f"{meta_path} does not match its own checksum: the file was edited or damaged")
        if meta.get("sha256") != sha256_file(weights):
            raise ValueError(f"{weights} does not match the checksum in {meta_path}: the file is damaged or was changed")
        saved = meta.get("fingerprint")
        expected = {**cache.fingerprint, "weights": weights_digest(model)}
        if saved != expected:
            saved = saved if isinstance(saved, dict) else {}
            diff = sorted(k for k in set(expected) | set(saved) if saved.get(k) != expected.get(k))
            raise ValueError(
                f"the cache in {directory} was saved for another model, other weights or feature maps, or another LoLA config (they differ in {diff})"
            )
        lengths = meta.get("cumulative_lengths")
        if not (isinstance(lengths, list) and len(lengths) == len(cache.layers) and all(type(n) is int and n >= 0 for n in lengths)):
            raise ValueError(f"{meta_path}: cumulative_lengths must be {len(cache.layers)} non-negative integers, got {lengths!r}")
        try:
            tensors = load_file(weights)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{weights} cannot be read as safetensors ({e})") from None
        for i, layer in enumerate(cache.layers):
            part = {k[len(f"layers.{i}.") :]: t for k, t in tensors.items() if k.startswith(f"layers.{i}.")}
            layer.cumulative_length = lengths[i]
            if part:
                module = cache._lola_modules[i]
                device = next(module.parameters()).device
                state = module.new_state()
                try:
                    state.load_state_dict({k: t.to(device) for k, t in part.items()})
                except (ValueError, RuntimeError, KeyError) as e:
                    raise ValueError(f"{weights}: layer {i}'s state does not fit this model's LoLA layer ({e})") from None
                seen = int(state.seen.max()) if state.seen.numel() else 0
                if seen > lengths[i]:
                    raise ValueError(f"{meta_path}: cumulative_lengths[{i}] = {lengths[i]} is less than the {seen} tokens layer {i}'s state has seen")
                layer.state = state
                layer.is_initialized = True
        return cache


def _meta_checksum(meta: dict) -> str:
    """sha256 of ``cache.json``'s content (its ``checksum`` entry left out), in canonical JSON."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
