"""The memory interface and the slot store shared by the exact (softmax) memories.

Stored memories use the ``[B, Hs, N, ·]`` layout of transformers caches: ``Hs`` storage heads
(the K/V heads, or the query heads when keys are stored per query head), ``N`` slots. A slot
is empty when its position is ``-1``; positions are the per-row count of real tokens seen
before the token (``0`` for the first real token of a row), so padding never gets one.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from lola.core.partials import LinearPartial, SoftmaxPartial
from lola.kernels.exact_attention.reference import masked_logits, partials_from_logits
from lola.memory.blocks import EMPTY, KVBlock, QueryBlock
from lola.memory.slots import SlotBuffer

__all__ = [
    "EMPTY",
    "ExactMemory",
    "ExactStore",
    "KVBlock",
    "LinearMemory",
    "MemorySystem",
    "QueryBlock",
    "SinkMemory",
    "SparseMemory",
    "WindowMemory",
    "check_role",
    "exact_logits",
    "partial_from_logits",
]


@runtime_checkable
class MemorySystem(Protocol):
    """What every memory of a LoLA layer provides.

    Softmax memories return a :class:`~lola.core.SoftmaxPartial` from ``read``; the linear
    state returns a :class:`~lola.core.LinearPartial`. The composer
    (:class:`lola.LoLAMemory`) merges them; nothing else needs to know a memory's type.
    """

    def read(self, query: QueryBlock) -> SoftmaxPartial | LinearPartial:
        """Answer ``query`` with a partial over what this memory holds."""
        ...

    def nbytes(self) -> int:
        """Bytes of tensor storage held."""
        ...

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors that fully describe the memory's contents."""
        ...

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore contents saved by :meth:`state_dict`."""
        ...

    def reset(self) -> None:
        """Forget everything (storage is freed; the next write allocates again)."""
        ...


# -- the roles the composer drives ------------------------------------------------------------------
# MemorySystem is what every memory answers (a partial); the role protocols below are exactly
# what :class:`lola.LoLAMemory` calls on each of its parts. A custom memory implements its role
# (subclassing a shipped memory is the short way, not a requirement); the composer checks the
# members at construction and names the missing ones.


@runtime_checkable
class ExactMemory(Protocol):
    """A softmax memory of key/value slots (sinks, window, sparse cache).

    Attributes:
        name: prefix of its tensors in a composed state dict.
        capacity: slots per (row, storage head); ``0`` disables the memory.
        block: the slots as a :class:`KVBlock` ``[B, Hs, capacity, ·]`` (``None`` before
            :meth:`allocate`); the composer reads it for candidates and the decode step.
        reads_block: ``True`` when :meth:`read` is exactly the softmax partial over
            :attr:`block` (the composer may then read several memories in one kernel call).
    """

    name: str
    capacity: int
    block: KVBlock | None
    reads_block: bool

    def allocate(self, batch: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, track_attention: bool) -> None: ...

    def read(self, query: QueryBlock, keep_logits: bool = False) -> SoftmaxPartial: ...

    def observe_attention(self, weights: torch.Tensor) -> None: ...

    def nbytes(self) -> int: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...

    def reset(self) -> None: ...


@runtime_checkable
class SinkMemory(ExactMemory, Protocol):
    """Pinned first tokens: ``write(k, v, pos) -> taken [B, L]`` stores those it keeps."""

    def write(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class WindowMemory(ExactMemory, Protocol):
    """The newest tokens: ``append`` new ones (``pos = -1``: do not store), ``pop_oldest`` at a
    step (returns the removed tokens as a block; empty slots may pad it). ``max_pending`` is
    the most tokens it buffers between steps. An optional
    ``push(k, v, pos, position)`` writes one token per row in place (the decode path; without
    it the composer calls ``append``)."""

    max_pending: int

    def append(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None: ...

    def pop_oldest(self, rows: torch.Tensor) -> KVBlock: ...


@runtime_checkable
class SparseMemory(ExactMemory, Protocol):
    """The policy's picks: ``select(candidates, scores, rows)`` keeps the top ones, returns the rest."""

    def select(self, candidates: KVBlock, scores: torch.Tensor, rows: torch.Tensor) -> KVBlock: ...


@runtime_checkable
class LinearMemory(Protocol):
    """The constant-size state every other token is folded into.

    ``state`` is ``(H [B, H, F, D], s [B, H, F])``; ``read`` answers queries with a
    :class:`~lola.core.LinearPartial`; ``write(fk, v, mask)`` folds tokens in.
    """

    name: str

    @property
    def state(self) -> tuple[torch.Tensor, torch.Tensor]: ...

    @property
    def allocated(self) -> bool: ...

    def allocate(self, batch: int, heads: int, feature_dim: int, head_dim: int, device: torch.device) -> None: ...

    def read(self, query: QueryBlock) -> LinearPartial: ...

    def write(self, fk: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> None: ...

    def nbytes(self) -> int: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...

    def reset(self) -> None: ...


def check_role(obj: object, role: type, argument: str) -> None:
    """Raise ``TypeError`` naming ``argument`` and the members of ``role`` that ``obj`` lacks."""
    present = set(dir(obj))  # dir() does not evaluate properties (an unallocated state raises)
    members = [m for m in _protocol_members(role) if m not in present]
    if members:
        raise TypeError(f"{argument} must implement lola.memory.{role.__name__}: {type(obj).__name__} lacks {', '.join(members)}")


def _protocol_members(role: type) -> list[str]:
    names: list[str] = []
    for klass in reversed(role.__mro__):
        if klass in (object, Protocol) or not getattr(klass, "_is_protocol", False):
            continue
        for name in list(getattr(klass, "__annotations__", {})) + [n for n, v in vars(klass).items() if callable(v) or isinstance(v, property)]:
            if not name.startswith("_") and name not in names:
                names.append(name)
    return names


def drop_unless_declared(cls: type, capability: str, overrides: tuple[str, ...]) -> None:
    """Set the declared capability ``capability`` (a class attribute) of ``cls`` to ``False`` when
    ``cls`` defines any of ``overrides`` itself without declaring the capability again: an
    override may break what the base class promised, so only its author can promise it anew.
    Call it from ``__init_subclass__``."""
    if any(name in cls.__dict__ for name in overrides) and capability not in cls.__dict__:
        setattr(cls, capability, False)


def exact_logits(query: QueryBlock, block: KVBlock) -> torch.Tensor:
    """Masked scores of queries against slots, grouped-query aware.

    Args:
        query: queries ``q [B, H, L, D]`` with positions ``[B, L]``.
        block: slots ``k [B, Hs, N, D]`` with positions ``[B, Hs, N]``; ``H % Hs == 0`` and
            query head ``h`` reads storage head ``h // (H // Hs)``.

    Returns:
        ``[B, H, L, N]`` float32 ``scale · q·k``, ``-inf`` where the slot is empty, later than
        the query, or the query is padding (:func:`lola.kernels.exact_attention.reference.masked_logits`).
    """
    return masked_logits(query.q, block.k, query.pos, block.pos, query.scale)


def partial_from_logits(logits: torch.Tensor, v: torch.Tensor, keep_logits: bool = False) -> SoftmaxPartial:
    """Softmax partial from masked logits (the arithmetic of :func:`lola.kernels.softmax_partial`).

    Args:
        logits: ``[B, H, L, N]`` float32, ``-inf`` where invisible.
        v: ``[B, Hs, N, D]`` values.
        keep_logits: attach ``logits`` to the partial (for attention-based policies).
    """
    num, den, m = partials_from_logits(logits, v)
    return SoftmaxPartial(num=num, den=den, max=m, logits=logits if keep_logits else None)


class ExactStore:
    """Fixed-capacity slot store of exact key/value pairs (base of sinks, window, sparse cache).

    Storage is allocated on the first write (then its size never changes):
    ``k, v: [B, Hs, capacity, D]`` in the input dtype, ``pos: [B, Hs, capacity]`` int64 and,
    when attention is tracked, ``acc: [B, Hs, capacity]`` float32.

    Args:
        capacity: number of slots per (row, storage head).
    """

    #: Prefix of this store's keys in a composed state dict.
    name = "exact"
    #: Declared capability: :meth:`read` is exactly the softmax partial over :attr:`block`, so the
    #: composer may read several stores with one kernel call (and decode with one fused step).
    reads_block = True
    #: Declared capability: the store reads and writes its slots only through :attr:`block`, so a
    #: composer may keep them in its slot buffer.
    binds = True

    def __init_subclass__(cls, **kwargs) -> None:
        # A subclass that brings a read, or storage, of its own declares what it keeps; one that
        # does not say loses the capability its override would break (a quantised cache
        # overriding `read` is read through it), never the other way round.
        super().__init_subclass__(**kwargs)
        drop_unless_declared(cls, "reads_block", ("read",))
        drop_unless_declared(cls, "binds", ("block", "allocate"))

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = int(capacity)
        self._slots: SlotBuffer | None = None  # the layer's buffer once a composer binds this store
        self._own: KVBlock | None = None  # storage of a store no composer owns

    # -- storage ------------------------------------------------------------------------------
    # A composer (:class:`lola.LoLAMemory`) binds its stock stores to one buffer of its own
    # (:class:`lola.memory.slots.SlotBuffer`): ``block`` is then a view of this store's range of it and
    # assigning ``block`` writes into it. A store on its own keeps its own tensors.
    @property
    def block(self) -> KVBlock | None:
        """The slots, ``[B, Hs, capacity, ·]`` (``None`` before allocation). Assigning a new
        block replaces the contents (do not set the fields of the one read here: it may be a
        view of the layer's shared buffer)."""
        slots = self._slots
        if slots is not None:
            return slots.view(self.name) if slots.allocated else None
        return self._own

    @block.setter
    def block(self, value: KVBlock | None) -> None:
        if self._slots is None:
            self._own = value
        elif value is not None:  # a bound store's storage is freed by its owner
            self._slots.write(self.name, value)

    def bind(self, slots: SlotBuffer) -> None:
        """Keep the slots in ``slots`` (a range named :attr:`name`, ``capacity`` wide), the
        buffer its composer owns; allocation is then the composer's."""
        if slots.ragged_name == self.name:  # per-head widths: this store's head_sizes
            if list(slots.head_widths) != list(getattr(self, "head_sizes", None) or []):
                raise ValueError(f"{slots!r} has no ragged region of {getattr(self, 'head_sizes', None)} slots per head named {self.name!r}")
        else:
            start, stop = slots.regions.get(self.name, (0, -1))
            if stop - start != self.capacity:
                raise ValueError(f"{slots!r} has no range of {self.capacity} slots named {self.name!r}")
        self._slots, self._own = slots, None

    def _writes_in_place(self) -> bool:
        """Whether this store may write into its slots directly (see
        :meth:`lola.memory.slots.SlotBuffer.writes_in_place`); a store on its own may when autograd
        is off."""
        if self._slots is not None:
            return self._slots.writes_in_place()
        return not torch.is_grad_enabled()

    # -- allocation ---------------------------------------------------------------------------
    def allocate(self, batch: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, track_attention: bool) -> None:
        """Allocate empty storage for ``batch`` rows and ``heads`` storage heads (a bound store's
        buffer is allocated by its composer: nothing to do)."""
        if self._slots is not None:
            return
        n = self.capacity
        self.block = KVBlock(
            k=torch.zeros(batch, heads, n, head_dim, dtype=dtype, device=device),
            v=torch.zeros(batch, heads, n, head_dim, dtype=dtype, device=device),
            pos=torch.full((batch, heads, n), EMPTY, dtype=torch.long, device=device),
            acc=torch.zeros(batch, heads, n, dtype=torch.float32, device=device) if track_attention else None,
        )

    @property
    def allocated(self) -> bool:
        return self.block is not None

    def _require(self) -> KVBlock:
        if self.block is None:
            raise RuntimeError(f"{type(self).__name__} is not allocated yet: write to it first")
        return self.block

    # -- MemorySystem -------------------------------------------------------------------------
    def read(self, query: QueryBlock, keep_logits: bool = False) -> SoftmaxPartial:
        """Softmax partial of ``query`` over the stored slots it may see (see :func:`exact_logits`)."""
        block = self._require()
        if keep_logits:
            return partial_from_logits(exact_logits(query, block), block.v, keep_logits=True)
        from lola.kernels import softmax_partial  # dispatches to Triton on CUDA

        num, den, m = softmax_partial(query.q, block.k, block.v, query.pos, block.pos, query.scale)
        return SoftmaxPartial(num, den, m)

    def observe_attention(self, weights: torch.Tensor) -> None:
        """Add attention mass ``weights [B, Hs, N]`` received by each slot (if tracked)."""
        block = self._require()
        if block.acc is not None:
            self.block = KVBlock(block.k, block.v, block.pos, block.acc + weights.detach())

    def nbytes(self) -> int:
        """Bytes of the slots held (a bound store: its range of the layer's buffer)."""
        block = self.block
        if block is None:
            return 0
        return sum(t.numel() * t.element_size() for t in (block.k, block.v, block.pos, block.acc) if t is not None)

    def state_dict(self) -> dict[str, torch.Tensor]:
        if self.block is None:
            return {}
        # copies: the slots are written in place later (and a bound store's are a range of the
        # layer's buffer); a state dict is a record of now, safetensors-ready
        b = self.block
        out = {name: t.clone(memory_format=torch.contiguous_format) for name, t in (("k", b.k), ("v", b.v), ("pos", b.pos), ("acc", b.acc)) if t is not None}
        return out | self.layout_entry(b.pos)

    def layout_entry(self, pos: torch.Tensor) -> dict[str, torch.Tensor]:
        """A store of per-head sizes records them with its slots: ``head_sizes [B, Hs]`` int64,
        in head order (the same shapes hold other sizes of the same total or width)."""
        sizes = getattr(self, "head_sizes", None)
        if not sizes:
            return {}
        return {"head_sizes": torch.tensor(sizes, dtype=torch.long, device=pos.device).expand(pos.shape[0], -1).contiguous()}

    def check_layout_entry(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state`` without its ``head_sizes``, after checking they are this store's.

        Raises:
            ValueError: sizes of another layout (or none where this store has them), naming both.
        """
        ours = list(getattr(self, "head_sizes", None) or [])
        saved = state.get("head_sizes")
        rest = {k: t for k, t in state.items() if k != "head_sizes"}
        if not ours and saved is None:
            return rest
        what = f"{type(self).__name__} ({self.name})"
        if saved is None:
            raise ValueError(f"{what} holds per-head sizes {ours}, but the state records none: it was saved by a layer of another layout")
        if not ours:
            raise ValueError(f"{what} has one size for every head, but the state was saved with per-head sizes {saved[0].tolist()}")
        if saved.dim() != 2 or saved.dtype != torch.long or saved.shape[1] != len(ours) or bool((saved != torch.tensor(ours, device=saved.device)).any()):
            shown = saved[0].tolist() if saved.dim() == 2 and saved.shape[0] else list(saved.shape)
            raise ValueError(
                f"{what}: the state was saved with per-head sizes {shown}, but this layer holds {ours} "
                "(a state loads only into the layout it was saved from: the heads' tokens would move)"
            )
        return rest

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if not state:
            self.block = None
            return
        state = self.check_layout_entry(state)
        missing = {"k", "v", "pos"} - state.keys()
        if missing:
            raise ValueError(f"{type(self).__name__} state is missing {sorted(missing)}")
        k, v, pos = state["k"], state["v"], state["pos"]
        if k.dim() != 4 or k.shape != v.shape or pos.shape != k.shape[:3] or k.shape[2] != self.capacity:
            raise ValueError(
                f"{type(self).__name__} state must hold k, v [B, Hs, {self.capacity}, D] and pos [B, Hs, {self.capacity}], "
                f"got k {tuple(k.shape)}, v {tuple(v.shape)}, pos {tuple(pos.shape)}"
            )
        acc = state.get("acc")
        if self._slots is not None:  # written into the buffer (a copy)
            self.block = KVBlock(k, v, pos, acc)
        else:
            self.block = KVBlock(k.clone(), v.clone(), pos.clone(), None if acc is None else acc.clone())

    def reset(self) -> None:
        self._own = None  # a bound store's buffer is reset by its composer

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.capacity})"
