"""A layer's state kept in external buffers, one row per sequence (what a serving engine's pages are).

A server allocates one tensor per state component, ``[slots, ...]`` with the per-row shapes
:func:`page_layout` gives (the engine's own layout: the exact slots as one ``[Hs, N, D]``
buffer, the linear state ``[H, F, D]``), and binds the rows of a batch to a
:class:`lola.LoLAMemory` (:func:`bind`): row ``i`` of the state is page ``rows[i]``.

- Rows that form one contiguous range are *views* of the pages: every write of the engine
  (the window's ring slot, a select-and-evict step, the fold into the linear state) lands in
  the pages in place; nothing is copied, nothing allocated.
- Other rows are gathered once at :func:`bind` and written back by index after every call
  (:func:`sync`): only the ring slot each row wrote when a call decoded one token per row with
  no step, the whole rows otherwise. A server that decodes the same rows again keeps the bound
  memory between calls instead of binding again (the pages stay current either way).

``seen`` (each row's token count) is a page too when the pages have one, else the caller gives
it to :func:`bind` (a server knows it).

A page has one owner: binding a row that another live state is bound to is refused (both would
write it). A state gives its rows up when it is released (:meth:`lola.LoLAMemory.release_pages`),
reset, loaded, reordered, or garbage-collected.
"""

from __future__ import annotations

import gc
import weakref
from typing import Mapping

import torch

from lola.engine.state import LayerState, PageBinding
from lola.engine.state_checks import LAYOUT_KEY, StateLayout, decode_layout, describe_layout, encode_layout, layout_difference, layout_width, summary
from lola.memory.base import EMPTY, KVBlock
from lola.policies.base import keeps_tallies

__all__ = ["PageBinding", "bind", "check_pages_content", "clear_rows", "page_layout", "sync"]


# Every state bound to pages, to find the owner of a page (weak: a dropped state owns nothing).
_BOUND: "weakref.WeakSet[LayerState]" = weakref.WeakSet()


def _row_addresses(page: torch.Tensor, rows: torch.Tensor) -> dict[int, int]:
    """``{first byte: row}`` of ``rows`` of ``page``: pages of one buffer name a row by its first byte."""
    _, first, stride, _ = _row_spans(page)
    return {first + r * stride: r for r in rows.tolist()}


def _owner_of(memory: LayerState, page: torch.Tensor, rows: torch.Tensor) -> tuple[LayerState, list[int]] | None:
    """Another live state bound to one of ``rows`` of ``page`` (its ``slots.k``), and those rows."""
    storage = page.untyped_storage().data_ptr()
    wanted = None
    for other in list(_BOUND):
        bound = other.binding
        if other is memory or bound is None or bound.pages["slots.k"].untyped_storage().data_ptr() != storage:
            continue
        wanted = _row_addresses(page, rows) if wanted is None else wanted
        taken = _row_addresses(bound.pages["slots.k"], bound.rows).keys() & wanted.keys()
        if taken:
            return other, sorted(wanted[a] for a in taken)
    return None


def _claim(memory: LayerState, page: torch.Tensor, rows: torch.Tensor) -> None:
    """Refuse rows another live state is bound to (a dropped state in a reference cycle is
    collected first: it owns nothing)."""
    clash = _owner_of(memory, page, rows)
    if clash is not None:
        gc.collect()
        clash = _owner_of(memory, page, rows)
    if clash is not None:
        other, taken = clash
        raise ValueError(
            f"pages {taken[:8]}{' …' if len(taken) > 8 else ''} are bound to another state ({type(other).__name__} at {id(other):#x}): "
            "two states writing one page would overwrite each other; release that state first (release_pages(), reset() or drop it)"
        )


def _require_bindable(memory: LayerState) -> None:
    # (the write-back of a decoded token assumes the stock ring: token p in slot p % capacity)
    if not memory.buffered or not getattr(memory.linear, "snapshots", False) or not getattr(memory.window, "ring", False):
        raise ValueError(
            f"{memory!r} cannot be bound to pages: binding needs exact stores kept in the layer's slot buffer (`binds`), "
            "a window whose token p sits in slot p % capacity (`ring`) and a linear state held as its tensors H, s (`snapshots`)"
        )


def page_layout(
    memory: LayerState, num_heads: int, storage_heads: int, head_dim: int, feature_dim: int, dtype: torch.dtype, seen: bool = False
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Each page's per-row shape and dtype: ``slots.k``, ``slots.v`` ``[Hs, N, D]`` (``dtype``),
    ``slots.pos`` ``[Hs, N]`` int64, ``slots.acc`` ``[Hs, N]`` float32 (policies that tally
    attention or keep scores), with per-head sparse sizes their run ``ragged.k``, ``ragged.v``
    ``[1, Σ λ_h, D]``, ``ragged.pos`` ``[1, Σ λ_h]`` (and ``ragged.acc``), ``linear.H`` ``[H, F, D]`` and ``linear.s`` ``[H, F]`` float32, the query
    statistics' tensors (policies that read them), ``layout`` ``[W]`` uint8 (the layout
    descriptor, :func:`lola.engine.state_checks.describe_layout`, stamped by :func:`bind`: pages
    of another feature map, window, sinks or sparse sizes may have the same shapes) and, with
    ``seen``, ``seen`` ``[]`` int64."""
    _require_bindable(memory)
    n = memory.slots.width
    out: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        "slots.k": ((storage_heads, n, head_dim), dtype),
        "slots.v": ((storage_heads, n, head_dim), dtype),
        "slots.pos": ((storage_heads, n), torch.long),
    }
    if keeps_tallies(memory.policy):
        out["slots.acc"] = ((storage_heads, n), torch.float32)
    if memory.slots.ragged_name is not None:  # per-head sparse sizes: each head's own range of one run
        run = memory.slots.offsets[-1]
        out.update({"ragged.k": ((1, run, head_dim), dtype), "ragged.v": ((1, run, head_dim), dtype), "ragged.pos": ((1, run), torch.long)})
        if keeps_tallies(memory.policy):
            out["ragged.acc"] = ((1, run), torch.float32)
    out["linear.H"] = ((num_heads, feature_dim, head_dim), torch.float32)
    out["linear.s"] = ((num_heads, feature_dim), torch.float32)
    if memory.queries is not None:
        out.update(
            {
                f"{memory.queries.name}.n": ((num_heads,), torch.float32),
                f"{memory.queries.name}.sum": ((num_heads, head_dim), torch.float32),
                f"{memory.queries.name}.sq": ((num_heads, head_dim, head_dim), torch.float32),
            }
        )
    out[LAYOUT_KEY] = ((layout_width(_page_descriptor(memory, num_heads, storage_heads, head_dim, feature_dim)),), torch.uint8)
    if seen:
        out["seen"] = ((), torch.long)
    return out


def _page_descriptor(memory: LayerState, num_heads: int, storage_heads: int, head_dim: int, feature_dim: int) -> dict[str, object]:
    """The layout descriptor of pages of this geometry bound to ``memory`` (the feature map its layer declared)."""
    declared = memory.layout
    geometry = StateLayout(num_heads, storage_heads, head_dim, feature_dim, feature_map=declared.feature_map if declared is not None else None)
    return describe_layout(memory, geometry)


def clear_rows(pages: Mapping[str, torch.Tensor], rows: torch.Tensor) -> None:
    """Make pages ``rows`` hold the empty state (a new sequence): positions ``-1``, the rest 0."""
    for key, page in pages.items():
        page.index_fill_(0, rows.to(page.device), EMPTY if key.endswith(".pos") else 0)


def _contiguous_start(rows: torch.Tensor) -> int | None:
    """The first page when ``rows`` is ``a, a+1, …`` (one host read of the rows), else ``None``."""
    values = rows.tolist()
    if values and values == list(range(values[0], values[0] + len(values))):
        return values[0]
    return None


def _row_spans(page: torch.Tensor) -> tuple[int, int, int, int]:
    """``(storage, first byte, row stride, row extent)`` in bytes of ``page [slots, ...]``: row
    ``i`` lies within ``[first + i·stride, first + i·stride + extent)``."""
    size = page.element_size()
    extent = 0 if page[:1].numel() == 0 else 1 + sum((n - 1) * st for n, st in zip(page.shape[1:], page.stride()[1:]))
    first = page.untyped_storage().data_ptr() + page.storage_offset() * size
    return page.untyped_storage().data_ptr(), first, page.stride(0) * size, extent * size


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two pages share a byte (each row taken as its whole span)."""
    (sa, fa, ra, la), (sb, fb, rb, lb) = _row_spans(a), _row_spans(b)
    n, m = a.shape[0], b.shape[0]
    if sa != sb or la == 0 or lb == 0 or n == 0 or m == 0:
        return False
    ra, rb = (rb, rb) if n == 1 else (ra, ra) if m == 1 else (ra, rb)  # one row's stride is arbitrary
    if ra != rb or ra <= 0:  # not one layout's pages: compare the whole spans
        return fa < fb + (m - 1) * rb + lb and fb < fa + (n - 1) * ra + la
    # Row i of a and row j of b meet iff -lb < d0 + k·r < la, with k = j - i in [-(n-1), m-1].
    d0, r = fb - fa, ra
    k_low = (-lb - d0) // r + 1  # the least k with d0 + k·r > -lb
    k_high = -((d0 - la) // r) - 1  # the greatest k with d0 + k·r < la
    return max(k_low, -(n - 1)) <= min(k_high, m - 1)


def check_pages_content(pages: Mapping[str, torch.Tensor], rows: torch.Tensor, seen: torch.Tensor) -> None:
    """Refuse pages a run of the engine could not have written or that would overwrite each
    other: two pages sharing memory (a key page aliased to a value page), a negative ``seen``,
    or a bound row holding a position outside ``[-1, seen)`` (``-1``: an empty slot).

    Args:
        pages: as :func:`bind` takes them.
        rows: ``[B]`` the bound pages.
        seen: ``[B]`` their token counts.
    """
    keys = sorted(pages)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            if _overlap(pages[a], pages[b]):
                raise ValueError(f"pages[{a!r}] and pages[{b!r}] share memory: every state component needs buffers of its own (one would overwrite the other)")
    pos = pages["slots.pos"].index_select(0, rows)  # [B, Hs, N]
    if "ragged.pos" in pages:  # the ragged run's positions too: [B, Hs·N + run]
        pos = torch.cat([pos.flatten(1), pages["ragged.pos"].index_select(0, rows).flatten(1)], dim=1)
    held = pos.flatten(1).amax(dim=1) if pos[0].numel() else torch.full_like(seen, EMPTY)
    low = pos.flatten(1).amin(dim=1) if pos[0].numel() else torch.full_like(seen, EMPTY)
    bad = (held >= seen) | (low < EMPTY)  # a negative seen fails the first: every position is >= -1
    if bool(bad.any()):  # one read back for the whole check
        r = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"page {int(rows[r])} (row {r}) is inconsistent: it has seen {int(seen[r])} tokens but holds positions {int(low[r])} … {int(held[r])} "
            f"(expected seen >= 0 and positions in [{EMPTY}, seen), {EMPTY} for an empty slot; clear a new sequence's pages with clear_rows)"
        )


def _check_page_layout(page: object, rows: torch.Tensor, ours: dict[str, object], strict: bool) -> None:
    """Refuse rows of the ``layout`` page stamped with another layout than ``ours`` (a cleared page
    holds zeros: not yet stamped), naming the page, both layouts and the first field that differs.
    Run first, before the pages' shapes are compared (pages of another layout may have other
    shapes too), and not ``strict`` there: rows that hold no descriptor are left to the checks of
    shapes and content, then refused (``strict``)."""
    if not isinstance(page, torch.Tensor) or page.dtype != torch.uint8 or page.dim() != 2:
        return  # (the shape check names it)
    try:
        held = decode_layout(page.index_select(0, rows.to(page.device)), f"pages[{LAYOUT_KEY!r}] (page {rows.tolist()[:8]})")
    except ValueError:
        if strict:
            raise
        return
    for r, theirs in enumerate(held):
        diff = None if theirs is None else layout_difference(theirs, ours)
        if diff is not None:
            field, a, b = diff
            raise ValueError(
                f"page {int(rows[r])} holds a state of {a}, but this layer is of {b} (layout field {field!r}; "
                f"a page binds only to the layout that wrote it: clear a new sequence's pages with clear_rows): page {summary(theirs)}; this layer {summary(ours)}"
            )


def bind(memory: LayerState, pages: Mapping[str, torch.Tensor], rows: torch.Tensor, seen: torch.Tensor | None = None, check: bool = True) -> None:
    """Make ``memory``'s state the rows ``rows [B]`` of ``pages`` (see the module's text).

    Args:
        pages: ``{key: [slots, *shape]}`` with the keys, per-row shapes and dtypes of
            :func:`page_layout` (any geometry it allows), on one device.
        rows: ``[B]`` int64 page of each row.
        seen: ``[B]`` int64 tokens each row has seen; required when ``pages`` has no ``seen``.
        check: check the pages' content (:func:`check_pages_content`); off only where the
            engine binds pages it has just written itself.

    Raises:
        ValueError: naming the page and what was expected.
    """
    _require_bindable(memory)
    pages = dict(pages)
    k = pages.get("slots.k")
    H = pages.get("linear.H")
    if not isinstance(k, torch.Tensor) or k.dim() != 4 or not isinstance(H, torch.Tensor) or H.dim() != 4:
        raise ValueError("pages must hold 'slots.k' [slots, Hs, N, D] and 'linear.H' [slots, H, F, D] (see lola.engine.state_pages.page_layout)")
    ours = _page_descriptor(memory, H.shape[1], k.shape[1], k.shape[3], H.shape[2])
    rows_given = isinstance(rows, torch.Tensor) and rows.dim() == 1 and not (rows.is_floating_point() or rows.is_complex() or rows.dtype == torch.bool)
    if check and rows_given and rows.numel() and int(rows.min()) >= 0 and int(rows.max()) < k.shape[0]:
        _check_page_layout(pages.get(LAYOUT_KEY), rows.long(), ours, strict=False)  # the layout first (the rows are checked below)
    expected = page_layout(memory, H.shape[1], k.shape[1], k.shape[3], H.shape[2], k.dtype, seen="seen" in pages)
    if set(pages) != set(expected):
        raise ValueError(f"pages must hold exactly {sorted(expected)}, got {sorted(pages)}")
    for key, (shape, dtype) in expected.items():
        page = pages[key]
        if tuple(page.shape[1:]) != shape or page.dtype != dtype or page.shape[0] != k.shape[0] or page.device != k.device:
            raise ValueError(
                f"pages[{key!r}] must be [{k.shape[0]}, {', '.join(map(str, shape))}] {dtype} on {k.device}, got {list(page.shape)} {page.dtype} on {page.device}"
            )
    if not isinstance(rows, torch.Tensor) or rows.is_floating_point() or rows.is_complex() or rows.dtype == torch.bool:
        raise TypeError(f"rows must be a 1-D tensor of int pages, got {rows.dtype if isinstance(rows, torch.Tensor) else type(rows).__name__}")
    rows = rows.to(device=k.device, dtype=torch.long)
    if rows.dim() != 1 or (rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= k.shape[0])):
        raise ValueError(f"rows must be a 1-D tensor of pages in [0, {k.shape[0]}), got {rows.tolist()}")
    if rows.unique().numel() != rows.numel():
        raise ValueError(f"rows must name each page once (two rows in one page would overwrite each other), got {rows.tolist()}")
    if "seen" not in pages and (seen is None or tuple(seen.shape) != tuple(rows.shape)):
        raise ValueError(f"seen must give each of the {rows.numel()} rows its token count (the pages hold none)")
    _claim(memory, k, rows)
    if check:
        check_pages_content(pages, rows, pages["seen"].index_select(0, rows) if "seen" in pages else seen.to(device=k.device, dtype=torch.long))
    layout = pages[LAYOUT_KEY]
    if check:
        _check_page_layout(layout, rows, ours, strict=True)
    layout.index_copy_(0, rows, encode_layout(ours, rows.numel(), layout.device, layout.shape[1]))
    start = _contiguous_start(rows)

    def take(page: torch.Tensor) -> torch.Tensor:
        return page.narrow(0, start, rows.numel()) if start is not None else page.index_select(0, rows)

    def block(prefix: str) -> KVBlock:
        acc = pages.get(f"{prefix}.acc")
        return KVBlock(take(pages[f"{prefix}.k"]), take(pages[f"{prefix}.v"]), take(pages[f"{prefix}.pos"]), None if acc is None else take(acc))

    memory.slots.use(block("slots"), block("ragged") if "ragged.k" in pages else None)
    memory.linear.H, memory.linear.s, memory.linear.shared = take(pages["linear.H"]), take(pages["linear.s"]), False
    if memory.queries is not None:
        name = memory.queries.name
        memory.queries.n, memory.queries.sum, memory.queries.sq = (take(pages[f"{name}.{f}"]) for f in ("n", "sum", "sq"))
    memory.seen = (take(pages["seen"]) if "seen" in pages else seen.to(device=k.device, dtype=torch.long)).clone()
    memory.num_heads = H.shape[1]
    memory.binding = PageBinding(pages, rows, start)
    _BOUND.add(memory)


def _live(memory: LayerState) -> dict[str, torch.Tensor]:
    """The bound state's tensors by page key."""
    w = memory.slots.whole
    out = {"slots.k": w.k, "slots.v": w.v, "slots.pos": w.pos, "linear.H": memory.linear.H, "linear.s": memory.linear.s}
    if w.acc is not None:
        out["slots.acc"] = w.acc
    r = memory.slots.run
    if r is not None:
        out.update({"ragged.k": r.k, "ragged.v": r.v, "ragged.pos": r.pos})
        if r.acc is not None:
            out["ragged.acc"] = r.acc
    if memory.queries is not None:
        out.update({f"{memory.queries.name}.{f}": getattr(memory.queries, f) for f in ("n", "sum", "sq")})
    out["seen"] = memory.seen
    return out


def sync(memory: LayerState, pushed: torch.Tensor | None) -> None:
    """Bring the bound pages up to date after a call.

    Args:
        pushed: ``[B]`` the positions written when the call only wrote one ring slot per row
            (a decoded token, no step, nothing else changed), else ``None`` (whole rows).
    """
    bound = memory.binding
    live = {key: t for key, t in _live(memory).items() if key in bound.pages}
    if bound.start is not None:
        # Views: what was written in place is there; a tensor replaced (copy-on-write) is
        # copied back and the state bound to the pages again.
        replaced = False  # (``seen`` is always a tensor of its own: copied, never a reason to rebind)
        for key, t in live.items():
            dst = bound.pages[key].narrow(0, bound.start, t.shape[0])
            if t.data_ptr() != dst.data_ptr() or t.stride() != dst.stride():
                dst.copy_(t)
                replaced = replaced or key != "seen"
        if replaced:
            counts = (memory.counts.host, memory.counts.due)  # the host's counts stay known
            bind(memory, bound.pages, bound.rows, None if "seen" in bound.pages else memory.seen, check=False)  # written by the engine
            memory.counts.host, memory.counts.due = counts
        return
    if pushed is None:
        for key, t in live.items():
            bound.pages[key].index_copy_(0, bound.rows, t)
        return
    # One token per row went into its ring slot: those slots (and the counts) are all that changed.
    window = memory.window
    cap, start = window.capacity, memory.slots.regions[window.name][0]
    slot = start + pushed % cap  # [B]
    b = torch.arange(slot.shape[0], device=slot.device)
    for key in ("slots.k", "slots.v", "slots.pos"):
        bound.pages[key][bound.rows, :, slot] = live[key][b, :, slot]
    if "seen" in bound.pages:
        bound.pages["seen"].index_copy_(0, bound.rows, memory.seen)
