"""The checks of a layer's state from outside: a state dict no run could have written is refused.

:func:`check_state` is the one check of every state that comes from outside
(:meth:`lola.LoLAMemory.load_state_dict`, ``LoLACache.load``); :class:`StateLayout` is the
geometry a layer declares for its state, which a loaded state is compared with.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

import torch

__all__ = [
    "LAYOUT_KEY",
    "CheckedState",
    "StateLayout",
    "check_layout",
    "check_row_index",
    "check_state",
    "decode_layout",
    "describe_layout",
    "encode_layout",
    "layout_of",
    "reference_of",
]


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
        feature_map: the feature map's name (``hedgehog``, ``hedgehog_identity``, ``elu``, …):
            maps of one ``F`` fill the linear state with other features.
    """

    num_heads: int
    storage_heads: int
    head_dim: int
    feature_dim: int
    non_negative: bool = False
    feature_map: str | None = None


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

    First the layout the state was written in (``state['layout']``, :func:`check_layout`):
    the feature map, heads, sinks, window, sparse sizes a state of the same shapes may differ in.
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
    # First the layout the state was written in (a state of the same shapes may be of another)
    if memory is not None:
        check_layout(state, memory)
    elif LAYOUT_KEY in state:
        decode_layout(state[LAYOUT_KEY], f"state[{LAYOUT_KEY!r}]")
    state = {k: t for k, t in state.items() if k != LAYOUT_KEY}
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
        own = memory.state_dict()
        own.pop(LAYOUT_KEY, None)  # compared first, by check_layout
        return own, set()
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
        twins.append({k: t for k, t in twin.state_dict().items() if k != LAYOUT_KEY})
    a, b = twins
    return a, {k for k in a if a[k].dtype != b[k].dtype}


# -- the layout a state is written in --------------------------------------------------------------

LAYOUT_VERSION = 1
"""The version of the layout descriptor (:func:`describe_layout`) stamped on saved states and pages."""

LAYOUT_KEY = "layout"
"""The state-dict entry (and page) holding the layout descriptor: ``[B, W]`` uint8, each row the
descriptor's JSON, zero-padded."""

_LAYOUT_FIELDS = ("feature_map", "feature_dim", "num_heads", "storage_heads", "head_dim", "gqa_storage", "sinks", "window", "max_pending", "sparse")


def _sizes(part: object) -> object:
    """A store's size as its layout records it: its per-head sizes, else its one size (or its
    description when it declares neither)."""
    sizes = getattr(part, "head_sizes", None)
    if isinstance(sizes, (list, tuple)) and sizes:
        return [int(s) for s in sizes]
    size = getattr(part, "size", None)
    if not isinstance(size, int) or isinstance(size, bool):
        size = getattr(part, "capacity", None)
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    from lola.engine.parts import describe_part

    return describe_part(part)


def describe_layout(memory: Any, geometry: StateLayout | None = None) -> dict[str, object]:
    """The one descriptor of how ``memory``'s state is laid out and read: the feature map (its
    name and ``F``), the heads, storage heads and ``D`` (from ``geometry``, else the
    :attr:`layout` its layer declared; left out when neither is known), the GQA storage, the
    sinks, the window (per head) and its pending tokens, and the sparse sizes (per head).

    Two states of the same tensor shapes may differ in any of these (a hedgehog ``f = 8`` map
    and ``hedgehog_identity`` both hold 16 features; window 8 and sparse 4 hold the slots of window
    4 and sparse 8): the descriptor is stamped on every saved state and bound page, and compared
    first (:func:`check_layout`)."""
    g = geometry or getattr(memory, "layout", None)
    out: dict[str, object] = {"v": LAYOUT_VERSION}
    if g is not None:
        if g.feature_map is not None:
            out["feature_map"] = g.feature_map
        out.update(feature_dim=g.feature_dim, num_heads=g.num_heads, storage_heads=g.storage_heads, head_dim=g.head_dim)
    out.update(
        gqa_storage=memory.gqa_storage,
        sinks=_sizes(memory.sinks),
        window=_sizes(memory.window),
        max_pending=getattr(memory.window, "max_pending", None),
        sparse=_sizes(memory.sparse),
    )
    return out


def layout_width(descriptor: dict[str, object]) -> int:
    """Bytes a descriptor is stored in: its JSON rounded up to 128 bytes, at least 256."""
    n = len(json.dumps(descriptor, separators=(",", ":")).encode())
    return max(256, -(-n // 128) * 128)


def encode_layout(descriptor: dict[str, object], rows: int, device: torch.device, width: int | None = None) -> torch.Tensor:
    """``descriptor`` as ``[rows, width]`` uint8: its JSON, zero-padded (one copy per row)."""
    data = json.dumps(descriptor, separators=(",", ":")).encode()
    width = width or layout_width(descriptor)
    row = torch.zeros(width, dtype=torch.uint8)
    row[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    return row.to(device).expand(rows, -1).contiguous()


def decode_layout(t: torch.Tensor, what: str) -> list[dict[str, object] | None]:
    """The descriptors of each row of ``t [B, W]`` uint8 (``None`` for a row of zeros: a cleared
    page, not yet stamped).

    Raises:
        ValueError: naming ``what``, when a row holds no descriptor :func:`encode_layout` writes.
    """
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 2:
        raise ValueError(f"{what} must be a [B, W] torch.uint8 layout descriptor, got {getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    out: list[dict[str, object] | None] = []
    rows = t.cpu()
    unique, inverse = rows.unique(dim=0, return_inverse=True) if rows.shape[0] else (rows, torch.zeros(0, dtype=torch.long))
    decoded: list[dict[str, object] | None] = []
    for row in unique:
        data = bytes(row.tolist()).rstrip(b"\0")
        if not data:
            decoded.append(None)
            continue
        try:
            d = json.loads(data.decode())
        except (UnicodeDecodeError, ValueError):
            d = None
        if not isinstance(d, dict) or not isinstance(d.get("v"), int) or isinstance(d.get("v"), bool):
            raise ValueError(f"{what} holds no layout descriptor (damaged, or not written by lola)")
        if d["v"] > LAYOUT_VERSION:
            raise ValueError(f"{what} holds a layout descriptor of version {d['v']}; this lola reads up to {LAYOUT_VERSION} (a newer lola wrote it)")
        decoded.append(d)
    for i in inverse.tolist():
        out.append(decoded[i])
    return out


def _same_value(a: object, b: object) -> bool:
    """One size for every head equals per-head sizes that are all that size."""
    if isinstance(a, int) and isinstance(b, list):
        a, b = b, a
    if isinstance(a, list) and isinstance(b, int) and not isinstance(b, bool):
        return all(x == b for x in a)
    return a == b


def _label(field: str, d: dict[str, object]) -> str:
    """``d``'s ``field`` in words (the feature map with its ``F``)."""
    value = d.get(field)
    if field == "feature_map":
        return f"feature map {value} (F={d.get('feature_dim', '?')})"
    if field == "feature_dim":  # the linear state's shape differs too
        return f"feature map {d.get('feature_map', '(unnamed)')} (F={value}: a linear state of {value} features per head)"
    if field in ("window", "sparse"):
        return f"{field} per-head sizes {value}" if isinstance(value, list) else f"{field} size {value}"
    words = {"num_heads": "{} heads", "storage_heads": "{} storage heads", "head_dim": "head_dim {}", "gqa_storage": "gqa_storage {}", "sinks": "{} sinks"}
    return words.get(field, field + " {}").format(value)


def layout_difference(saved: dict[str, object], ours: dict[str, object]) -> tuple[str, str, str] | None:
    """The first field (in :data:`_LAYOUT_FIELDS` order) in which two descriptors differ, and each
    one's in words; ``None`` when they agree on every field both record."""
    for field in _LAYOUT_FIELDS:
        if field in saved and field in ours and not _same_value(saved[field], ours[field]):
            return field, _label(field, saved), _label(field, ours)
    return None


def summary(d: dict[str, object]) -> str:
    """A descriptor in one line."""
    return ", ".join(f"{k}={d[k]}".replace(" ", "") for k in _LAYOUT_FIELDS if k in d)


def check_layout(state: dict[str, torch.Tensor], memory: Any) -> None:
    """Refuse a state whose layout descriptor (``state['layout']``) is not ``memory``'s
    (:func:`describe_layout`), naming both layouts and the first field that differs. A state
    saved before descriptors (none) is left to the other checks.

    Raises:
        ValueError: on one line.
    """
    if LAYOUT_KEY not in state:
        return
    rows = decode_layout(state[LAYOUT_KEY], f"state[{LAYOUT_KEY!r}]")
    if not rows or rows[0] is None:
        raise ValueError(f"state[{LAYOUT_KEY!r}] holds no layout descriptor (a row of zeros)")
    if any(r != rows[0] for r in rows[1:]):
        raise ValueError(f"state[{LAYOUT_KEY!r}] holds rows of different layouts: a state is of one layout")
    ours = describe_layout(memory)
    diff = layout_difference(rows[0], ours)
    if diff is not None:
        field, theirs, mine = diff
        raise ValueError(
            f"a state of {theirs} cannot load into a layer of {mine} (layout field {field!r}; a state loads only into the layout that wrote it): "
            f"saved {summary(rows[0])}; this layer {summary(ours)}"
        )
