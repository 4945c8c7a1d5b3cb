"""LoLACache: a transformers ``Cache`` whose LoLA layers hold constant-size state."""

from __future__ import annotations

import hashlib
import json
import os
import re
import weakref
from pathlib import Path
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

from lola.engine.composer import LoLAMemory
from lola.integrations.transformers.attention import announce
from lola.integrations.transformers.model_record import applied, check_attention_implementation, context_limit
from lola.io.checksums import sha256_file, weights_digest
from lola.limits import MAX_TOKENS

__all__ = ["LoLACache", "LoLACacheLayer"]

_FORMAT = "lola-cache/2"
"""The format :meth:`LoLACache.save` writes: 2 stamps each layer's state with its layout
descriptor (``layers.<i>.layout``, :func:`lola.engine.state_checks.describe_layout`)."""
_READ_FORMATS = ("lola-cache/1", _FORMAT)
"""The formats :meth:`LoLACache.load` reads: 1 (no layout descriptor: the other checks alone)."""


class LoLACacheLayer(CacheLayerMixin):
    """One decoder layer's LoLA state (:class:`lola.LoLAMemory`), inside a transformers cache.

    ``update`` returns only the new keys and values (the attention function writes them into
    the state); ``get_seq_length`` is the number of columns seen, padding included, so
    positions and RoPE stay right.
    """

    is_sliding = False
    # Not compileable: transformers compiles the whole forward of a compileable cache on an
    # accelerator (and builds 4-D masks for it), while a LoLA layer decides on the host when its
    # schedule steps (counts kept on the host, no device read per token): compiled, each count
    # would be a guard and every token a recompilation. The decode step itself compiles
    # (tests/kernels/test_decoding.py); a compiled layer needs the schedule on the device first.
    is_compileable = False
    is_croppable = False

    def __init__(self, owner: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.state: LoLAMemory | None = None
        self.cumulative_length = 0
        self.pending_key: torch.Tensor | None = None
        # the LoLA layer whose state this is: another model's layer must not read or extend it
        self.owner = None if owner is None else weakref.ref(owner)

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
        """Keep rows ``indices`` (int rows, or a bool mask of one entry per row)."""
        if self.state is not None and self.state.allocated:
            index = torch.as_tensor(indices)
            if index.dtype == torch.bool:
                rows = self.state.batch_size
                if index.dim() != 1 or index.shape[0] != rows:
                    raise ValueError(
                        f"indices: a bool mask must hold one entry per row of the cache ({rows}), got shape {tuple(index.shape)}; give the rows to keep as int indices"
                    )
                index = index.nonzero().flatten()
            elif index.dim() != 1:
                raise ValueError(f"indices must be a 1-D tensor of rows in [0, {self.state.batch_size}), got shape {tuple(index.shape)}")
            self.state.select_rows(index)

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
        layers = [DynamicLayer() if i in full else LoLACacheLayer(info.modules.get(i)) for i in range(info.num_layers)]
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
        check_attention_implementation(own)

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
        """Write the cache to ``directory``: ``cache.json`` and the tensors it names
        (``cache-<sha256 prefix>.safetensors``).

        ``cache.json`` records the model's fingerprint (shape, LoLA config, a digest of its
        weights and feature maps), the lengths seen, the tensors' file and its sha256. Saving
        over an earlier cache is atomic: the new tensors go to a file named by their content,
        ``cache.json`` is replaced last, and only then is the earlier tensors' file removed, so a
        crash at any point leaves one whole cache (the new or the earlier one). A folder whose
        ``cache.json`` is not a lola cache, or links in place of the files, are refused.
        Only LoLA layers can be saved; a cache with full-attention layers raises.
        """
        from safetensors.torch import save

        from lola.io.outputs import check_target, write_files
        from lola.io.provenance import versions

        self.check_model()
        tensors: dict[str, torch.Tensor] = {}
        lengths = []
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, LoLACacheLayer):
                raise NotImplementedError(f"layer {i} is a full-attention layer; saving such caches is not supported")
            lengths.append(layer.cumulative_length)
            if layer.state is not None:
                tensors.update({f"layers.{i}.{k}": t.detach().contiguous().cpu() for k, t in layer.state.state_dict().items()})
        directory = Path(directory)
        meta_path = directory / _META_FILE
        check_target(meta_path, _is_cache_description, "LoLACache.save")
        previous = _tensor_file(_read_meta(meta_path)) if meta_path.is_file() else None
        data = save(tensors)
        digest = hashlib.sha256(data).hexdigest()
        weights = f"cache-{digest[:16]}.safetensors"
        meta = {
            "format": _FORMAT,
            "fingerprint": {**self.fingerprint, "weights": weights_digest(self._model(), every_value=True)},
            "cumulative_lengths": lengths,
            "versions": versions(),
            "tensors": weights,
            "sha256": digest,
        }
        meta["checksum"] = _meta_checksum(meta)
        # Only the file the earlier cache.json names is ours to remove (the legacy fixed name
        # too, when it names it); a cache.safetensors beside no lola cache.json is someone's.
        stale = [previous] if previous and previous != weights else []
        write_files(directory, {weights: data, _META_FILE: json.dumps(meta, indent=2) + "\n"}, writer="LoLACache.save", remove=stale)

    @classmethod
    def load(cls, directory: str | os.PathLike, model: torch.nn.Module) -> "LoLACache":
        """Read a cache written by :meth:`save` for ``model``.

        Raises ``ValueError`` (naming the file) if the folder does not hold a lola cache, a file
        is damaged or edited, or the cache was saved for another model, other weights or
        feature maps, or another LoLA config.
        """
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        from lola.io.outputs import finish_pending

        cache = cls(model)
        if os.path.isdir(directory):
            finish_pending(directory)  # a save that a kill cut short: completed first
        meta_path = os.path.join(directory, _META_FILE)
        if not os.path.isfile(meta_path):
            raise ValueError(f"{directory} does not hold a lola cache: {meta_path} is missing")
        meta = _read_meta(Path(meta_path))
        if not isinstance(meta, dict) or meta.get("format") not in _READ_FORMATS:
            found = meta.get("format") if isinstance(meta, dict) else None
            raise ValueError(f"{directory} does not hold a lola cache (format {found!r}, expected one of {list(_READ_FORMATS)})")
        if meta.get("checksum") != _meta_checksum(meta):
            raise ValueError(f"{meta_path} does not match its own checksum: the file was edited or damaged")
        weights = os.path.join(directory, _tensor_file(meta, meta_path))
        if not os.path.isfile(weights):
            raise ValueError(f"{directory} does not hold a lola cache: {weights} is missing")
        if meta.get("sha256") != sha256_file(weights):
            raise ValueError(f"{weights} does not match the checksum in {meta_path}: the file is damaged or was changed")
        saved = meta.get("fingerprint")
        expected = {**cache.fingerprint, "weights": weights_digest(model, every_value=True)}
        if saved != expected:
            saved = saved if isinstance(saved, dict) else {}
            diff = sorted(k for k in set(expected) | set(saved) if saved.get(k) != expected.get(k))
            raise ValueError(
                f"the cache in {directory} was saved for another model, other weights or feature maps, or another LoLA config (they differ in {diff})"
            )
        lengths = meta.get("cumulative_lengths")
        # Positions beyond the model's (or any context LoLA is meant for) would decode with
        # RoPE far outside what it was trained on.
        positions = context_limit(model)
        most = min(MAX_TOKENS, positions) if positions is not None else MAX_TOKENS
        if not (isinstance(lengths, list) and len(lengths) == len(cache.layers) and all(type(n) is int and 0 <= n <= most for n in lengths)):
            shown = repr(lengths[:8])[:-1] + ", ...]" if isinstance(lengths, list) and len(lengths) > 8 else repr(lengths)
            bound = f"the model's max_position_embeddings ({positions})" if most != MAX_TOKENS else f"lola.limits.MAX_TOKENS ({MAX_TOKENS})"
            raise ValueError(f"{meta_path}: cumulative_lengths must be {len(cache.layers)} integers from 0 to {bound}, got {shown}")
        try:
            tensors = load_file(weights)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{weights} cannot be read as safetensors ({e})") from None
        prefixes = tuple(f"layers.{i}." for i in range(len(cache.layers)))
        foreign = sorted(k for k in tensors if not k.startswith(prefixes))
        if foreign:  # dropped unread, they would hide an edit or a cache of another model
            raise ValueError(f"{weights} holds tensors of no layer of this model's {len(cache.layers)} ({', '.join(foreign[:3])}): the cache was edited")
        for i, layer in enumerate(cache.layers):
            part = {k[len(f"layers.{i}.") :]: t for k, t in tensors.items() if k.startswith(f"layers.{i}.")}
            layer.cumulative_length = lengths[i]
            if not part and lengths[i] > 0:  # the layer would decode as if it had seen nothing
                raise ValueError(
                    f"{meta_path}: layer {i} has seen {lengths[i]} tokens (cumulative_lengths) but {weights} holds no state for it: the cache is incomplete"
                )
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


_META_FILE = "cache.json"
_LEGACY_TENSORS = "cache.safetensors"  # the tensors' name before it was content-addressed
_TENSOR_NAME = re.compile(r"^cache-[0-9a-f]{16}\.safetensors$")


def _read_meta(path: Path) -> Any:
    """``cache.json``'s content, read by :func:`lola.io.outputs.read_json` (the one strict JSON
    reader: not UTF-8, garbled, a key given twice or not a regular file is a ``ValueError``
    naming it)."""
    from lola.io.outputs import read_json

    return read_json(path, "valid JSON (a lola cache description, written by LoLACache.save)")


def _is_cache_description(path: Path) -> bool:
    """Whether ``path`` is a ``cache.json`` that ``LoLACache.save`` wrote (and may replace)."""
    try:
        meta = _read_meta(path)
    except (ValueError, OSError):
        return False
    return isinstance(meta, dict) and meta.get("format") in _READ_FORMATS


def _tensor_file(meta: Any, meta_path: Any = _META_FILE) -> str:
    """The tensors' file name that ``cache.json`` names: ``cache-<16 hex>.safetensors`` (or the
    earlier fixed ``cache.safetensors``); never a path, so a description cannot point elsewhere."""
    name = meta.get("tensors", _LEGACY_TENSORS) if isinstance(meta, dict) else None
    if name != _LEGACY_TENSORS and not (isinstance(name, str) and _TENSOR_NAME.match(name)):
        raise ValueError(f"{meta_path}: tensors must be a file name cache-<16 hex digits>.safetensors beside it, got {name!r}")
    return name


def _meta_checksum(meta: dict) -> str:
    """sha256 of ``cache.json``'s content (its ``checksum`` entry left out), in canonical JSON."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
