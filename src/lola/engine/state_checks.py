"""The checks of a layer's state from outside: a state dict no run could have written is refused.

:func:`check_state` is the one check of every state that comes from outside
(:meth:`lola.LoLAMemory.load_state_dict`, ``LoLACache.load``); :class:`StateLayout` is the
geometry a layer declares for its state, which a loaded state is compared with.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

import torch

__all__ = ["CheckedState", "StateLayout", "check_row_index", "check_state", "layout_of", "reference_of"]


@dataclass(frozen=True)
class StateLayout:
    """The geometry of a layer's state, declared by the layer it belongs to
    (:meth:`lola.LoLAAttention.new_state`); :func:`check_state` compares a loaded state with
    what a state of this geometry holds.

    Attributes:
        num_heads: query heads ``H`` (the linear state's heads).
        storage_heads: heads the exact memories store (``H_kv``, or ``H`` per query head).
        head_dim: ``D``.
        feature_dim: ``F``, the size of ``φ(k)``.
        non_negative: the key feature map's features are ``>= 0``, and so is ``linear.s``.
    """

    num_heads: int
    storage_heads: int
    head_dim: int
    feature_dim: int
    non_negative: bool = False


class CheckedState(Protocol):
    """What :func:`check_state` reads of the state a dict is checked against (a
    :class:`lola.LoLAMemory`)."""

    policy: object
    queries: object
    linear: object
    window: object
    sinks: object
    layout: StateLayout | None

    @property
    def allocated(self) -> bool: ...

    @property
    def seen(self) -> torch.Tensor | None: ...

    def reference_state(self, state: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], set[str]] | None: ...

    def stateful_parts(self) -> list: ...


def layout_of(state: dict[str, torch.Tensor], linear: str, window: str) -> StateLayout | None:
    """The geometry a state claims: heads, ``F`` and ``D`` from its linear ``H [B, H, F, D]``,
    storage heads from its window's ``k [B, Hs, N, D]`` (``None`` if it lacks either)."""
    H, k = state.get(f"{linear}.H"), state.get(f"{window}.k")
    if not (isinstance(H, torch.Tensor) and H.dim() == 4 and isinstance(k, torch.Tensor) and k.dim() == 4):
        return None
    return StateLayout(num_heads=H.shape[1], storage_heads=k.shape[1], head_dim=H.shape[3], feature_dim=H.shape[2])


def _check_layout(state: dict[str, torch.Tensor], memory: CheckedState) -> None:
    """``state`` against what ``memory`` holds (:meth:`LoLAMemory.reference_state`): the same
    keys, dtypes, and shapes but the batch. First the per-head layout of each exact store: a
    state of other per-head sizes of the same total has the same shapes."""
    for part in memory.stateful_parts():
        check_layout = getattr(part, "check_layout_entry", None)
        key = f"{part.name}.head_sizes"
        if check_layout is not None and (key in state or getattr(part, "head_sizes", None)):
            check_layout({"head_sizes": state[key]} if key in state else {})
    found = memory.reference_state(state)
    if found is None:
        return
    reference, follow = found
    unknown = sorted(set(state) - set(reference))
    if unknown:
        raise ValueError(f"state holds unknown tensors {unknown}: this layer's memories hold {sorted(reference)}")
    missing = sorted(set(reference) - set(state))
    if missing:
        why = ""
        if all(k.endswith(".acc") for k in missing):
            from lola.policies.registry import describe

            kept = getattr(memory.policy, "keeps_scores", False)
            held = "the score it keeps" if kept else "the attention mass it scores by"
            why = f" ({held} per slot, for policy {describe(memory.policy)})"
        owners = {m.name: type(m).__name__ for m in memory.stateful_parts()}
        by_part: dict[str, list[str]] = {}
        for key in missing:
            by_part.setdefault(owners.get(key.split(".", 1)[0], "LoLAMemory"), []).append(key)
        held = "; ".join(f"{part} state must hold {keys}" for part, keys in by_part.items())
        raise ValueError(f"{held}{why}: the state lacks them (was it saved by a layer of another configuration?)")
    # Keys and values share one float dtype, the memory's once allocated; when the state
    # disagrees with itself the odd ones out are named.
    dtype = None
    if follow:
        counts = Counter(state[k].dtype for k in reference if k in follow)
        dtype = counts.most_common(1)[0][0]
        if not dtype.is_floating_point:
            raise ValueError(f"state[{sorted(follow)[0]!r}] must hold floats (keys and values), got {dtype}")
    for key, ref in reference.items():
        t, want = state[key], dtype if key in follow else ref.dtype
        if t.dtype != want:
            kind = "floats" if want.is_floating_point else "integers"
            like = " like the state's other keys and values" if key in follow else ""
            raise ValueError(f"state[{key!r}] must be {want} {kind}{like}, got {t.dtype}")
    batch = state["seen"].shape[0]
    for key, ref in reference.items():
        t = state[key]
        if t.dim() != ref.dim() or t.shape[1:] != ref.shape[1:]:
            raise ValueError(f"state[{key!r}] has shape {tuple(t.shape)}, this layer's is [B, {', '.join(map(str, ref.shape[1:]))}]")
        if t.shape[0] != batch:
            raise ValueError(f"state[{key!r}] holds {t.shape[0]} rows, 'seen' {batch}")


def check_state(state: dict[str, torch.Tensor], memory: CheckedState | None = None) -> None:
    """Refuse a state dict no run (of ``memory``, when given) could have written; the one check of
    every state that comes from outside (:meth:`LoLAMemory.load_state_dict`, ``LoLACache.load``).

    Always: every value a tensor, ``seen`` a ``[B]`` int64 count ``>= 0``, finite floats,
    the slots' attention tallies (``.acc``, unless ``memory``'s policy keeps scores there) ``>= 0``, and positions ``[B, Hs, N]`` int64 below their row's
    ``seen``, no position held by two exact slots of a row and storage head. Against
    ``memory`` (see :meth:`LoLAMemory.reference_state`): the same keys (an unknown one is
    refused, a missing one named), the same dtypes (positions int64, keys and values one float
    dtype, the memory's once allocated), the same shapes but the batch (one for all), the
    normaliser ``linear.s >= 0`` when the layer's feature map is non-negative, and the query
    statistics' weight ``queries.n >= 0``.

    Raises:
        ValueError: naming the tensor and what is wrong.
    """
    for key, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"state[{key!r}] must be a tensor, got {type(t).__name__}")
    seen = state["seen"]
    if seen.dtype != torch.int64 or seen.dim() != 1:
        raise ValueError(f"state['seen'] must be a 1-D torch.int64 tensor, got {seen.dtype} {tuple(seen.shape)}")
    # One device for the whole state: the memory's once allocated, else the one 'seen' is on;
    # never `meta` (shapes without data).
    device = memory.seen.device if memory is not None and memory.allocated else seen.device
    where = "this memory's" if memory is not None and memory.allocated else "state['seen']'s"
    for key, t in state.items():
        if t.device.type == "meta":
            raise ValueError(f"state[{key!r}] lies on the meta device: it holds no values")
        if t.device != device:
            raise ValueError(f"state[{key!r}] lies on {t.device}, but {where} device is {device}: a state lies on one device")
    if memory is not None:
        _check_layout(state, memory)
    for key, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"state[{key!r}] holds non-finite values (inf or NaN)")
    if bool((seen < 0).any()):
        raise ValueError("state['seen'] holds negative counts")
    # Sums of non-negative terms: attention weights, the statistics' decay weights, and the
    # features of a non-negative map (a negative normaliser flips the linear read's sign).
    # Kept scores (a `keeps_scores` policy) may be negative; attention tallies may not.
    scores_kept = memory is not None and bool(getattr(memory.policy, "keeps_scores", False))
    sums = {} if scores_kept else {k: "attention weights" for k in state if k.endswith(".acc")}
    if memory is not None and memory.queries is not None:
        sums[f"{memory.queries.name}.n"] = "query weights"
    if memory is not None and getattr(memory.linear, "sums_features", False) and memory.layout is not None and memory.layout.non_negative:
        sums[f"{memory.linear.name}.s"] = "the features of a non-negative feature map"
    for key, what in sums.items():
        if key in state and bool((state[key] < 0).any()):
            raise ValueError(f"state[{key!r}] holds negative values, but it sums {what}: no run could have written it")
    positions = [(k, t) for k, t in state.items() if k.endswith(".pos")]
    if not positions:
        return
    for key, pos in positions:
        if pos.dtype != torch.int64 or pos.dim() != 3 or pos.shape[0] != seen.shape[0]:
            raise ValueError(f"state[{key!r}] must be [batch {seen.shape[0]}, heads, slots] torch.int64 integers, got {pos.dtype} {tuple(pos.shape)}")
        if bool((pos >= seen.view(-1, 1, 1)).any()):
            raise ValueError(f"state[{key!r}] holds a position at or beyond its row's 'seen' count")
    if memory is not None and getattr(memory.window, "ring", False):  # the stock window's ring: the newest tokens
        _check_window(state, seen, memory)
    # Memories with the same storage heads are compared together (per-head sparse sizes may
    # store a memory per query head while the others store per K/V head).
    by_heads: dict[int, list[tuple[str, torch.Tensor]]] = {}
    for key, pos in positions:
        pos = _per_head(pos, _head_sizes(memory, key))
        by_heads.setdefault(pos.shape[1], []).append((key, pos))
    for group in by_heads.values():
        every = torch.cat([pos for _, pos in group], dim=2)  # [B, Hs, all slots], -1 = empty
        ordered = every.sort(dim=2).values
        repeated = (ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)
        if bool(repeated.any()):
            raise ValueError(f"a position is held twice in one row and storage head ({', '.join(k for k, _ in group)}): the state is damaged")


def _head_sizes(memory: CheckedState | None, key: str) -> list[int] | None:
    """The per-head sizes of the store whose positions are ``state[key]``, when it saves them as
    one ragged run (``[B, 1, Σ λ_h]``), else ``None``."""
    if memory is None:
        return None
    for m in memory.stateful_parts():
        sizes = getattr(m, "head_sizes", None)
        if key == f"{getattr(m, 'name', None)}.pos" and isinstance(sizes, (list, tuple)) and len(sizes) > 1:
            return list(sizes)
    return None


def _per_head(pos: torch.Tensor, sizes: list[int] | None) -> torch.Tensor:
    """``pos [B, 1, Σ sizes]`` (a ragged run: head ``h``'s slots one after another) spread to
    ``[B, len(sizes), max sizes]``, ``-1`` past each head's size; other positions as they are."""
    if sizes is None or pos.shape[1] != 1 or pos.shape[2] != sum(sizes):
        return pos
    out = pos.new_full((pos.shape[0], len(sizes), max(sizes)), -1)
    start = 0
    for h, n in enumerate(sizes):
        out[:, h, :n] = pos[:, 0, start : start + n]
        start += n
    return out


def _check_window(state: dict[str, torch.Tensor], seen: torch.Tensor, memory: CheckedState) -> None:
    """A window with the stock ring (``ring`` declared) holds its row's newest tokens: per row and storage
    head, ``n`` consecutive positions ending at ``seen - 1`` (none while the row fills its
    sinks), and at least ``min(size, seen - sinks)`` of them (a step keeps the newest ``size``)."""
    window = memory.window
    key = f"{window.name}.pos"
    pos = state.get(key)
    if pos is None or pos.shape[-1] == 0:
        return
    valid = pos >= 0
    n = valid.sum(-1)  # [B, Hs]
    newest = pos.amax(-1)
    oldest = torch.where(valid, pos, torch.iinfo(torch.int64).max).amin(-1)
    last = seen.view(-1, 1) - 1
    head_sizes = getattr(window, "head_sizes", None)
    if head_sizes and len(head_sizes) == pos.shape[1]:
        sizes = head_sizes
    elif isinstance(getattr(window, "size", None), int):
        sizes = [window.size] * pos.shape[1]
    else:  # a ring of no declared size: only its consecutive newest tokens are checked
        sizes = [0] * pos.shape[1]
    size = torch.tensor(sizes, dtype=torch.int64, device=pos.device).view(1, -1)
    least = torch.minimum(size, (seen.view(-1, 1) - memory.sinks.capacity).clamp_min(0))
    bad = ((n > 0) & ((newest != last) | (newest - oldest != n - 1))) | (n < least)
    if bool(bad.any()):
        row, head = (int(i) for i in bad.nonzero()[0])
        held = sorted(int(p) for p in pos[row, head] if p >= 0)
        span = f"positions {held[0]}..{held[-1]} ({len(held)} held)" if held else "no position"
        raise ValueError(
            f"state[{key!r}] row {row} storage head {head} holds {span}, but a sliding window holds its row's newest tokens: "
            f"at least {int(least[row, head])} consecutive positions ending at seen - 1 = {int(seen[row]) - 1}"
        )


def check_row_index(index: object, rows: int, name: str, repeats: bool, device: torch.device) -> torch.Tensor:
    """``index`` as a 1-D int64 tensor of rows in ``[0, rows)`` on ``device``, else an error
    naming ``name`` (:func:`lola.core.checks.require`: no wait on an accelerator); with
    ``repeats=False`` each row at most once (rows written to)."""
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"{name} must be a 1-D int64 tensor of rows, got a {type(index).__name__}")
    if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
        raise TypeError(f"{name} must be a tensor of int rows, got {index.dtype}")
    if index.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor of rows, got shape {tuple(index.shape)}")
    from lola.core.checks import require

    index = index.to(device=device, dtype=torch.long)
    # (beam search reorders every layer at every step: on an accelerator this is an asynchronous assert)
    if index.numel() and not require((index.amin() >= 0) & (index.amax() < rows), f"{name} must hold rows in [0, {rows})"):
        raise ValueError(f"{name} must hold rows in [0, {rows}) (the state's batch), got {index.tolist()[:8]}")
    if not repeats and index.unique().numel() != index.numel():
        raise ValueError(f"{name} must name each row once (two rows written to one would overwrite each other), got {index.tolist()[:8]}")
    return index


def reference_of(memory: Any, state: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], set[str]] | None:
    """What a state of ``memory`` (a :class:`~lola.engine.state.LayerState`) holds, for
    :func:`check_state`: ``(tensors, follow)``.

    Once allocated, its own tensors (``follow`` empty: every dtype is fixed). Before, the
    tensors of a twin allocated for one row on the ``meta`` device (no memory is used),
    for the :attr:`layout` its layer declared or, without one, the geometry read off
    ``state``'s ``linear.H`` and ``window.k``; ``follow`` names the tensors whose dtype is
    the keys' and values' (the twin is allocated twice, in two dtypes, to tell them).
    ``None`` when neither tells the geometry, or when a custom part cannot be copied or
    allocated on ``meta`` (the checks that need no reference still run).
    """
    if memory.allocated:
        return memory.state_dict(), set()
    layout = memory.layout or layout_of(state or {}, memory.linear.name, memory.window.name)
    if layout is None:
        return None
    twins = []
    for dtype in (torch.float16, torch.bfloat16):
        try:
            parts = copy.deepcopy((memory.sinks, memory.window, memory.sparse, memory.linear, memory.queries))  # unallocated: no tensors to copy
            twin = type(memory)(
                sinks=parts[0],
                window=parts[1],
                sparse=parts[2],
                linear=parts[3],
                queries=parts[4],
                policy=memory.policy,
                schedule=memory.schedule,
                gqa_storage=memory.gqa_storage,
            )
            twin.allocate(1, layout.num_heads, layout.storage_heads, layout.head_dim, layout.feature_dim, dtype, torch.device("meta"))
        except Exception:  # a custom part that cannot be copied or allocated on meta
            return None
        twins.append(twin.state_dict())
    a, b = twins
    return a, {k for k in a if a[k].dtype != b[k].dtype}
