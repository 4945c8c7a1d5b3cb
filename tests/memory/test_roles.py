"""The composer drives its parts through the role protocols only: a window written from scratch
(no lola base class) composes into a layer, and a part that lacks a member is named."""

import pytest
import torch

import lola
from lola import kernels
from lola.core import SoftmaxPartial
from lola.memory import KVBlock, LinearState, SinkTokens, SparseCache
from lola.memory import WindowMemory as WindowRole
from lola.memory.base import check_role


class SortedWindow:
    """A sliding window kept sorted by position (empty slots first), written against the
    :class:`lola.memory.WindowMemory` role alone: no lola base class, no ``push``."""

    name = "window"

    def __init__(self, size: int, max_pending: int) -> None:
        self.size, self.max_pending = size, max_pending
        self.capacity = size + max_pending
        self.block = None
        self.reads_block = True

    def allocate(self, batch, heads, head_dim, dtype, device, track_attention):
        n = self.capacity
        zeros = torch.zeros(batch, heads, n, head_dim, dtype=dtype, device=device)
        self.block = KVBlock(zeros, zeros.clone(), torch.full((batch, heads, n), -1, dtype=torch.long, device=device))

    def append(self, k, v, pos):
        hs = self.block.k.shape[1]
        new = KVBlock(k.to(self.block.k.dtype), v.to(self.block.v.dtype), pos[:, None, :].expand(-1, hs, -1))
        merged = KVBlock.cat([self.block, new])
        if int(merged.valid.sum(-1).max()) > self.capacity:
            raise RuntimeError("SortedWindow overflow")
        order = merged.pos.argsort(dim=-1, stable=True)[..., -self.capacity :]
        self.block = merged.gather(order)

    def pop_oldest(self, rows):
        slot = torch.arange(self.capacity)
        leaving = self.block.valid & (slot < self.capacity - self.size) & rows[:, None, None]
        out = self.block.masked(leaving)
        self.block = self.block.masked(~leaving)
        return out

    def read(self, query, keep_logits=False):
        b = self.block
        return SoftmaxPartial(*kernels.softmax_partial(query.q, b.k, b.v, query.pos, b.pos, query.scale))

    def observe_attention(self, weights):
        pass

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.state_dict().values())

    def state_dict(self):
        return {} if self.block is None else {"k": self.block.k, "v": self.block.v, "pos": self.block.pos}

    def load_state_dict(self, state):
        self.block = KVBlock(state["k"].clone(), state["v"].clone(), state["pos"].clone()) if state else None

    def reset(self):
        self.block = None


def _layer(window, cfg):
    feature_maps = lola.feature_maps.build_feature_map
    memory = lambda: lola.LoLAMemory(  # noqa: E731
        window=window(),
        sparse=SparseCache(cfg.sparse_size),
        sinks=SinkTokens(cfg.sinks),
        linear=LinearState(),
        policy=lola.policies.build("sre"),
        schedule=lola.schedules.build("chunkwise", chunk=cfg.chunk),
    )
    torch.manual_seed(0)
    return lola.LoLAAttention(
        4,
        8,
        2,
        memory_factory=memory,
        feature_map_q=feature_maps(cfg.feature_map, 4, 8, cfg.feature_dim),
        feature_map_k=feature_maps(cfg.feature_map, 4, 8, cfg.feature_dim),
        mixing="lolcats",
    )


def test_a_window_written_from_scratch_equals_the_shipped_one():
    cfg = lola.LoLAConfig(window=5, sparse_size=4, sinks=2, chunk=3, mixing="lolcats")
    shipped = _layer(lambda: lola.memory.SlidingWindow(5, max_pending=3), cfg)
    custom = _layer(lambda: SortedWindow(5, max_pending=3), cfg)
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 40, 4, 8, generator=g), torch.randn(2, 40, 2, 8, generator=g), torch.randn(2, 40, 2, 8, generator=g)
    o1, s1 = shipped(q[:, :30], k[:, :30], v[:, :30])
    o2, s2 = custom(q[:, :30], k[:, :30], v[:, :30])
    torch.testing.assert_close(o1, o2)
    for i in range(30, 40):  # decode: the custom window has no push, the composer appends
        a, _ = shipped(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=s1)
        b, _ = custom(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=s2)
        torch.testing.assert_close(a, b)
    assert isinstance(s2.window, SortedWindow)


def test_a_part_that_lacks_members_is_named():
    with pytest.raises(TypeError, match=r"window must implement lola.memory.WindowMemory: object lacks .*append.*pop_oldest"):
        lola.LoLAMemory(window=object(), sparse=SparseCache(2), policy=lola.policies.build("sre"), schedule=lola.schedules.build("chunkwise", chunk=2))
    with pytest.raises(TypeError, match=r"sparse must implement lola.memory.SparseMemory: SinkTokens lacks select"):
        lola.LoLAMemory(
            window=lola.memory.SlidingWindow(2, max_pending=2),
            sparse=SinkTokens(2),
            policy=lola.policies.build("sre"),
            schedule=lola.schedules.build("chunkwise", chunk=2),
        )


def test_check_role_accepts_the_shipped_memories_before_allocation():
    check_role(lola.memory.SlidingWindow(3), WindowRole, "window")
    check_role(LinearState(), lola.memory.LinearMemory, "linear")  # its `state` raises until allocated


def test_the_engines_parts_are_still_found_under_their_old_names_with_a_warning():
    import lola.memory
    from lola.memory.slots import SlotBuffer

    with pytest.warns(DeprecationWarning, match="lola.memory.slots"):
        assert lola.memory.SlotBuffer is SlotBuffer
    with pytest.warns(DeprecationWarning, match="lola.memory.base"):
        assert lola.memory.check_role is check_role
    assert "SlotBuffer" not in lola.memory.__all__ and "check_role" not in lola.memory.__all__
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        lola.memory.nothing  # noqa: B018
