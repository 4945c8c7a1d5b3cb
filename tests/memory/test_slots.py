"""The slot buffer: one ``[B, Hs, N, ·]`` buffer of a layer's exact slots, each memory a range."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola
from lola.memory import KVBlock
from lola.memory.slots import SlotBuffer

REGIONS = [("sinks", 2), ("sparse", 3), ("window", 4)]


def _block(b: int, hs: int, n: int, d: int, seed: int) -> KVBlock:
    g = torch.Generator().manual_seed(seed)
    return KVBlock(torch.randn(b, hs, n, d, generator=g), torch.randn(b, hs, n, d, generator=g), torch.randint(-1, 50, (b, hs, n), generator=g))


def test_views_are_ranges_of_the_buffer_and_writes_land_in_it():
    slots = SlotBuffer(REGIONS)
    slots.allocate(2, 3, 4, torch.float32, torch.device("cpu"), False)
    base = slots.whole.k.untyped_storage().data_ptr()
    for name, (a, b) in slots.regions.items():
        view = slots.view(name)
        assert view.k.untyped_storage().data_ptr() == base and view.k.shape == (2, 3, b - a, 4)
        new = _block(2, 3, b - a, 4, seed=a)
        with torch.no_grad():  # (with autograd on, a write copies: a read may be saved for backward)
            slots.write(name, new)
        assert torch.equal(slots.whole.k[:, :, a:b], new.k) and torch.equal(slots.whole.pos[:, :, a:b], new.pos)
    assert slots.whole.k.untyped_storage().data_ptr() == base  # in place: nothing allocated
    assert slots.nbytes() == 2 * 3 * 9 * (2 * 4 * 4 + 8)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([n for n, _ in REGIONS]), st.integers(0, 10**6), st.booleans()), min_size=1, max_size=12))
def test_snapshots_keep_their_contents_and_writes_equal_plain_copies(writes):
    """Property: whatever the writes and wherever snapshots are taken, each snapshot still holds
    the buffer as it was when taken (copy-on-write), and the buffer equals one kept by plain
    out-of-place copies of the same writes."""
    slots = SlotBuffer(REGIONS)
    slots.allocate(1, 2, 3, torch.float32, torch.device("cpu"), False)
    plain = {f: getattr(slots.whole, f).clone() for f in ("k", "v", "pos")}
    kept = []
    for name, seed, snap in writes:
        a, b = slots.regions[name]
        new = _block(1, 2, b - a, 3, seed)
        slots.write(name, new)
        for f in plain:
            plain[f] = torch.cat([plain[f][:, :, :a], getattr(new, f), plain[f][:, :, b:]], dim=2)
        if snap:
            kept.append((slots.snapshot(), {f: t.clone() for f, t in plain.items()}))
    for f in plain:
        assert torch.equal(getattr(slots.whole, f), plain[f])
    for snapshot, expected in kept:
        for f in expected:
            assert torch.equal(getattr(snapshot, f), expected[f])


def test_writes_under_autograd_are_recorded():
    slots = SlotBuffer(REGIONS)
    slots.allocate(1, 1, 2, torch.float32, torch.device("cpu"), False)
    x = torch.randn(1, 1, 3, 2, requires_grad=True)
    slots.write("sparse", KVBlock(x * 2, x.detach(), torch.zeros(1, 1, 3, dtype=torch.long)))
    slots.whole.k.sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))


@given(st.sampled_from([{"sparse_size": 4}, {"sparse_size_per_head": [6, 0]}, {"sparse_size": 0}]), st.integers(20, 40))
@settings(max_examples=10, deadline=None)
def test_a_layer_keeps_every_exact_slot_in_one_buffer(sparse, tokens):
    """Property: the stock memories of a layer are ranges of its one buffer, in read order
    ``[sinks | sparse | window]`` (a sparse cache with per-head sizes: a run of its own, no head
    padded); prefill, decode and select-and-evict steps write into them without replacing them,
    and the decode step reads them themselves."""
    cfg = lola.LoLAConfig(window=8, sinks=2, chunk=8, **sparse)
    attn = lola.compose(cfg, num_heads=4, head_dim=16, num_kv_heads=2)
    g = torch.Generator().manual_seed(tokens)
    q, k, v = torch.randn(2, tokens, 4, 16, generator=g), torch.randn(2, tokens, 2, 16, generator=g), torch.randn(2, tokens, 2, 16, generator=g)
    with torch.inference_mode():
        _, state = attn(q[:, :17], k[:, :17], v[:, :17])
        whole = state.slots.whole
        base, row = whole.k.data_ptr(), whole.k.stride(2) * whole.k.element_size()
        start = 0
        for m in state.exact_memories:  # each memory a range, in read order
            if m.name == state.slots.ragged_name:  # per-head sizes: one run of each head's own slots
                assert state.slots.run.k.shape[2] == sum(m.head_sizes) and m.block.k.shape[2] == max(m.head_sizes)
                continue
            assert m.capacity == 0 or m.block.k.data_ptr() == base + start * row
            start += m.capacity
        assert start == whole.k.shape[2]
        run = None if state.slots.run is None else state.slots.run.k.data_ptr()
        for i in range(17, tokens):  # decode through at least one step (every 8 tokens)
            attn(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)
            assert state.slots.whole.k.data_ptr() == base and state.exact_slots() is state.slots.whole
            assert run is None or state.ragged_slots().k.data_ptr() == run
    held = sorted(int(p) for p in state.window.block.pos[0, 0] if p >= 0)
    assert held[-1] == tokens - 1 and state.nbytes() == state.slots.nbytes() + sum(t.nbytes for t in (*state.linear.state, state.seen))


@pytest.mark.parametrize("policy", ["sre", "attention"])
def test_backward_through_a_prefill_when_only_the_queries_need_gradients(policy):
    """A query that needs gradients reads the slots and the linear state, and autograd saves
    them: later steps must not write into them, even when nothing else needs gradients (frozen
    feature maps, a LoRA on the query projection only)."""
    cfg = lola.LoLAConfig(window=8, sparse_size=8, sinks=2, chunk=8, policy=policy, mixing="lolcats" if policy == "sre" else "softmax_only")
    attn = lola.compose(cfg, num_heads=2, head_dim=16, num_kv_heads=2)
    for p in attn.parameters():
        p.requires_grad_(False)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 64, 2, 16, generator=g, requires_grad=True)
    k, v = torch.randn(1, 64, 2, 16, generator=g), torch.randn(1, 64, 2, 16, generator=g)
    out, _ = attn(q, k, v)
    out.square().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_a_state_dict_is_a_record_of_its_moment():
    """The slots and the linear state are written in place as a state runs on; a state dict
    taken earlier keeps what it held (and is contiguous, safetensors-ready)."""
    cfg = lola.LoLAConfig(window=4, sparse_size=4, sinks=2, chunk=4, policy="attention", mixing="lola_authors")
    attn = lola.compose(cfg, num_heads=2, head_dim=8, num_kv_heads=1)
    q, k, v = torch.randn(1, 20, 2, 8), torch.randn(1, 20, 1, 8), torch.randn(1, 20, 1, 8)
    with torch.no_grad():
        _, state = attn(q[:, :10], k[:, :10], v[:, :10])
        saved = state.state_dict()
        kept = {key: t.clone() for key, t in saved.items()}
        for i in range(10, 20):
            _, state = attn(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)
    assert all(torch.equal(saved[key], kept[key]) for key in kept)
    assert all(t.is_contiguous() for t in saved.values())
    assert not torch.equal(state.state_dict()["linear.H"], saved["linear.H"])


RAGGED = [("sinks", 2), ("sparse", [4, 0, 2]), ("window", 3)]


def _padded(b: int, widths: list[int], d: int, seed: int) -> KVBlock:
    """A random ``[B, Hs, max width, ·]`` block whose slots past each head's width are empty."""
    blk = _block(b, len(widths), max(widths), d, seed)
    inside = torch.arange(max(widths))[None, :] < torch.tensor(widths)[:, None]
    return KVBlock(blk.k * inside[..., None], blk.v * inside[..., None], torch.where(inside, blk.pos, -1))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([n for n, _ in RAGGED]), st.integers(0, 10**6), st.booleans()), min_size=1, max_size=12))
def test_a_ragged_region_holds_each_heads_own_slots(writes):
    """Property: a region of per-head widths holds one run of ``Σ widths`` slots per row, head
    ``h``'s first ``width_h`` slots in ``offsets[h]:offsets[h + 1]``; its view is the padded block
    last written, and snapshots (of the buffer and of the run) keep what they held."""
    widths = RAGGED[1][1]
    slots = SlotBuffer(RAGGED)
    slots.allocate(2, 3, 4, torch.float32, torch.device("cpu"), False)
    assert slots.width == 5 and slots.offsets == (0, 4, 4, 6) and slots.run.k.shape == (2, 1, 6, 4)
    last = {name: slots.view(name) for name, _ in RAGGED}
    kept = []
    for name, seed, snap in writes:
        new = _padded(2, widths, 4, seed) if name == "sparse" else _block(2, 3, dict(RAGGED)[name], 4, seed)
        slots.write(name, new)
        last[name] = KVBlock(new.k.clone(), new.v.clone(), new.pos.clone())
        if snap:
            kept.append((slots.snapshot(), slots.ragged(), {n: KVBlock(b.k.clone(), b.v.clone(), b.pos.clone()) for n, b in last.items()}))
    for name, blk in last.items():
        for f in ("k", "v", "pos"):
            assert torch.equal(getattr(slots.view(name), f), getattr(blk, f))
    run = slots.ragged()
    for h, (a, b) in enumerate(zip(slots.offsets, slots.offsets[1:])):  # the run, head by head
        assert torch.equal(run.k[:, a:b], last["sparse"].k[:, h, : b - a]) and torch.equal(run.pos[:, a:b], last["sparse"].pos[:, h, : b - a])
    for whole, ragged, expected in kept:
        for name, (a, b) in slots.regions.items():
            assert torch.equal(whole.k[:, :, a:b], expected[name].k) and torch.equal(whole.pos[:, :, a:b], expected[name].pos)
        for h, (a, b) in enumerate(zip(slots.offsets, slots.offsets[1:])):
            assert torch.equal(ragged.k[:, a:b], expected["sparse"].k[:, h, : b - a])
    assert slots.nbytes() == 2 * (3 * 5 + 6) * (2 * 4 * 4 + 8)  # no head padded


def test_a_layer_with_per_head_sparse_sizes_holds_the_uniform_bytes():
    """The same total of sparse slots costs the same bytes, however it is spread over the heads;
    a sparse cache that overrides ``select`` without declaring ``ragged`` is held padded."""

    def held(sparse: lola.memory.SparseCache) -> int:
        window, schedule = lola.memory.SlidingWindow(8, max_pending=8), lola.schedules.build("chunkwise", chunk=8)
        state = lola.LoLAMemory(window=window, sparse=sparse, policy=lola.policies.build("sre"), schedule=schedule, sinks=lola.memory.SinkTokens(2))
        state.allocate(1, 6, 3, 16, 32, torch.float32, torch.device("cpu"))
        return state.nbytes()

    class Custom(lola.memory.SparseCache):
        def select(self, candidates, scores, rows):
            return super().select(candidates, scores, rows)

    uniform = held(lola.memory.SparseCache(6))
    assert held(lola.memory.SparseCache([14, 0, 4])) == uniform
    assert not Custom.ragged and held(Custom([14, 0, 4])) > uniform
