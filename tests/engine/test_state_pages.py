"""A state bound to external buffers by row (a server's pages) runs as the same state held alone."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola
from lola.engine.state_pages import clear_rows

H, HKV, D = 4, 2, 8
SLOTS = 6  # pages


def _pages(attn: lola.LoLAAttention, state: lola.LoLAMemory, seen: bool = False) -> dict[str, torch.Tensor]:
    layout = state.page_layout(H, attn.storage_heads(state), D, attn.feature_dim, torch.float32, seen=seen)
    pages = {key: torch.empty(SLOTS, *shape, dtype=dtype) for key, (shape, dtype) in layout.items()}
    for page in pages.values():  # garbage where no row is bound: clear_rows must reset it
        page.copy_(torch.randint(-3, 50, page.shape) if not page.is_floating_point() else torch.randn(page.shape))
    return pages


def _live(state: lola.LoLAMemory) -> dict[str, torch.Tensor]:
    w = state.slots.whole
    live = {"slots.k": w.k, "slots.v": w.v, "slots.pos": w.pos, "linear.H": state.linear.H, "linear.s": state.linear.s}
    return live if w.acc is None else {**live, "slots.acc": w.acc}


CONFIGS = [
    {"sparse_size": 3, "sinks": 2},
    {"sparse_size_per_head": [4, 0], "sinks": 0},
    {"sparse_size": 2, "sinks": 1, "schedule": "tokenwise"},
    {"sparse_size": 3, "sinks": 1, "policy": "at_exit"},  # scores kept in the slots' tallies
]


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(CONFIGS),
    st.sampled_from(["contiguous", "scattered"]),
    st.integers(1, 20),
    st.lists(st.sampled_from(["decode", "bind-again", "prefill"]), min_size=1, max_size=14),
    st.booleans(),
)
def test_a_state_bound_to_pages_runs_as_the_state_alone(sizes, placement, prefill, calls, seen_page):
    """Property: whatever the config, the rows' pages (one contiguous range, or scattered) and the
    calls (a prefill, decoded tokens across steps, binding the same rows again between calls),
    the outputs equal those of the same state held alone, and after every call the pages hold
    exactly that state; pages of other rows are not touched."""
    cfg = lola.LoLAConfig(window=4, chunk=4, mixing="lola_authors", **sizes)
    attn = lola.compose(cfg, num_heads=H, head_dim=D, num_kv_heads=HKV)
    g = torch.Generator().manual_seed(prefill + 7 * len(calls))
    steps = [prefill] + [3 if c == "prefill" else 1 for c in calls]
    total = sum(steps)
    q, k, v = (torch.randn(2, total, n, D, generator=g) for n in (H, HKV, HKV))
    rows = torch.tensor([2, 3] if placement == "contiguous" else [4, 1])
    with torch.no_grad():
        ref, bound = attn.new_state(), attn.new_state()
        ref.allocate(2, H, attn.storage_heads(ref), D, attn.feature_dim, torch.float32, torch.device("cpu"))
        pages = _pages(attn, ref, seen=seen_page)
        clear_rows(pages, rows)
        others = {key: t[[0, 5]].clone() for key, t in pages.items()}
        seen = torch.zeros(2, dtype=torch.long)
        bound.bind_pages(pages, rows, seen=None if seen_page else seen)
        at = 0
        for i, n in enumerate(steps):
            if i and calls[i - 1] == "bind-again":
                bound = attn.new_state()
                bound.bind_pages(pages, rows, seen=None if seen_page else torch.tensor([at, at]))
            sl = slice(at, at + n)
            o_ref, ref = attn(q[:, sl], k[:, sl], v[:, sl], state=ref)
            o, bound = attn(q[:, sl], k[:, sl], v[:, sl], state=bound)
            at += n
            torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-6)
            for key, t in _live(ref).items():
                assert torch.equal(pages[key][rows], t), key
            if seen_page:
                assert pages["seen"][rows].tolist() == [at, at]
        for key, t in others.items():
            assert torch.equal(pages[key][[0, 5]], t), key


def test_contiguous_rows_are_the_pages_themselves():
    """Rows of one range are views: decoding through steps writes the pages in place, the
    state's slots and linear state are the pages' memory, and no call copies them."""
    cfg = lola.LoLAConfig(window=4, chunk=4, sparse_size=3, sinks=2, mixing="lola_authors")
    attn = lola.compose(cfg, num_heads=H, head_dim=D, num_kv_heads=HKV)
    q, k, v = (torch.randn(2, 30, n, D) for n in (H, HKV, HKV))
    with torch.no_grad():
        state = attn.new_state()
        pages = _pages(attn, state, seen=True)
        rows = torch.tensor([1, 2])
        clear_rows(pages, rows)
        ptrs = {key: t.data_ptr() for key, t in pages.items()}
        state.bind_pages(pages, rows)
        _, state = attn(q[:, :10], k[:, :10], v[:, :10], state=state)
        for i in range(10, 30):  # five steps
            _, state = attn(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)
            assert state.slots.whole.k.data_ptr() == pages["slots.k"][1].data_ptr()
            assert state.linear.H.data_ptr() == pages["linear.H"][1].data_ptr()
    assert {key: t.data_ptr() for key, t in pages.items()} == ptrs
    assert pages["seen"][1:3].tolist() == [30, 30] and state.bound_pages is not None
    state.select_rows(torch.tensor([1, 0]))  # a state of its own again
    assert state.bound_pages is None and state.slots.whole.k.data_ptr() != pages["slots.k"][1].data_ptr()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda p: p.pop("linear.s"), "must hold exactly"),
        (lambda p: p.__setitem__("slots.pos", p["slots.pos"].int()), r"pages\['slots.pos'\] must be"),
        (lambda p: p.__setitem__("slots.k", p["slots.k"][:, :, :-1]), r"pages\['slots.v'\] must be|pages\['slots.k'\] must be"),
    ],
)
def test_pages_of_another_layout_are_refused(change, match):
    attn = lola.compose(lola.LoLAConfig(window=4, chunk=4, sparse_size=3), num_heads=H, head_dim=D, num_kv_heads=HKV)
    state = attn.new_state()
    pages = _pages(attn, state)
    change(pages)
    with pytest.raises(ValueError, match=match):
        state.bind_pages(pages, torch.tensor([0]), seen=torch.tensor([0]))


def test_rows_and_counts_are_checked():
    attn = lola.compose(lola.LoLAConfig(window=4, chunk=4, sparse_size=3), num_heads=H, head_dim=D, num_kv_heads=HKV)
    state = attn.new_state()
    pages = _pages(attn, state)
    with pytest.raises(ValueError, match="rows must be"):
        state.bind_pages(pages, torch.tensor([SLOTS]), seen=torch.tensor([0]))
    with pytest.raises(ValueError, match="seen must give"):
        state.bind_pages(pages, torch.tensor([0, 1]))


@pytest.mark.parametrize("rows", [[1, 2], [4, 0]], ids=["contiguous", "scattered"])
def test_a_bound_decode_reads_nothing_back_between_steps(monkeypatch, rows):
    """Decoding a bound state (its pages written in place, or written back by index) reads no
    tensor value back to the host on a token without a step, as the unbound decode does."""
    import lola.core.checks as checks
    from tests.host_reads import count_host_reads

    monkeypatch.setattr(checks, "HOST_DEVICES", frozenset())  # the CPU as an accelerator
    cfg = lola.LoLAConfig(window=4, chunk=4, sparse_size=3, sinks=2, mixing="lola_authors")
    attn = lola.compose(cfg, num_heads=H, head_dim=D, num_kv_heads=HKV)
    q, k, v = (torch.randn(2, 24, n, D) for n in (H, HKV, HKV))
    with torch.no_grad():
        state = attn.new_state()
        pages = _pages(attn, state)
        index = torch.tensor(rows)
        clear_rows(pages, index)
        state.bind_pages(pages, index, seen=torch.zeros(2, dtype=torch.long))
        _, state = attn(q[:, :9], k[:, :9], v[:, :9], state=state)
        attn(q[:, 9:10], k[:, 9:10], v[:, 9:10], state=state)  # the first token reads the counts once
        for i in range(10, 24):
            with count_host_reads() as reads:
                attn(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)
            stepping = i % 4 == 3
            assert sum(reads.values()) <= (2 if stepping else 0), (i, dict(reads))


def test_reads_deferred_past_later_writes_see_the_pages_as_they_were(monkeypatch):
    """With the reads of a prefill deferred (an accelerator's path), a state bound to one range
    of pages (its slots *are* the pages) or to scattered ones gives the outputs of the state held
    alone: the pages are brought up to date only once every waiting read is done."""
    import lola.engine.segment_reads as reads

    monkeypatch.setattr(reads, "READ_BYTES_CPU", 2**40)
    cfg = lola.LoLAConfig(window=4, chunk=4, sparse_size=3, sinks=2, mixing="lola_authors")
    attn = lola.compose(cfg, num_heads=H, head_dim=D, num_kv_heads=HKV)
    q, k, v = (torch.randn(1, 20, n, D) for n in (H, HKV, HKV))
    with torch.no_grad():
        expected, _ = attn(q, k, v)
        for rows in ([1], [4]):
            state = attn.new_state()
            pages = _pages(attn, state)
            clear_rows(pages, torch.tensor(rows))
            state.bind_pages(pages, torch.tensor(rows), seen=torch.zeros(1, dtype=torch.long))
            out, _ = attn(q, k, v, state=state)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def _bound_state():
    attn = lola.compose(lola.LoLAConfig(window=4, chunk=4, sparse_size=3, sinks=1), num_heads=H, head_dim=D, num_kv_heads=HKV)
    state = attn.new_state()
    pages = _pages(attn, state)
    clear_rows(pages, torch.arange(SLOTS))
    return attn, state, pages


def test_aliased_pages_are_refused():
    attn, state, pages = _bound_state()
    pages["slots.v"] = pages["slots.k"]  # keys and values in one buffer: each write would clobber the other
    with pytest.raises(ValueError, match=r"pages\['slots.k'\] and pages\['slots.v'\] share memory"):
        state.bind_pages(pages, torch.tensor([0]), seen=torch.tensor([0]))


def test_pages_cut_from_one_buffer_as_a_server_does_are_accepted():
    """One byte buffer per page, each component at its own offset (lola-attention-vllm's layout): rows of
    every component interleave in memory without sharing a byte."""
    attn, state, pages = _bound_state()
    widths = {key: t[0].numel() * t.element_size() for key, t in pages.items()}
    buf = torch.zeros(SLOTS, sum(widths.values()), dtype=torch.uint8)
    offset, cut = 0, {}
    for key in sorted(pages, key=lambda k: -pages[k].element_size()):
        cut[key] = buf[:, offset : offset + widths[key]].view(pages[key].dtype).view(pages[key].shape)
        cut[key].copy_(pages[key])
        offset += widths[key]
    state.bind_pages(cut, torch.tensor([3, 1]), seen=torch.tensor([0, 0]))
    q, k, v = (torch.randn(2, 9, n, D) for n in (H, HKV, HKV))
    with torch.no_grad():
        attn(q, k, v, state=state)
    assert int(cut["slots.pos"][3].max()) == 8  # the engine wrote through the views


@pytest.mark.parametrize(
    ("edit", "seen", "match"),
    [
        (None, -1, r"has seen -1 tokens"),
        (lambda p: p["slots.pos"][2, 0, 0].fill_(5), 5, r"page 2 \(row 0\) is inconsistent: it has seen 5 tokens but holds positions -1 … 5"),
        (lambda p: p["slots.pos"][2, 1, 2].fill_(-7), 9, r"holds positions -7 …"),
    ],
    ids=["negative-seen", "position-not-seen", "position-below-empty"],
)
def test_counts_and_positions_that_no_run_writes_are_refused(edit, seen, match):
    attn, state, pages = _bound_state()
    if edit is not None:
        edit(pages)
    with pytest.raises(ValueError, match=match):
        state.bind_pages(pages, torch.tensor([2]), seen=torch.tensor([seen]))
    pages["seen"] = torch.full((SLOTS,), seen)  # a seen page is read the same way
    with pytest.raises(ValueError, match=match):
        attn.new_state().bind_pages(pages, torch.tensor([2]))
    attn.new_state().bind_pages(pages, torch.tensor([2]), check=False)  # a server's own pages: not read back


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 9), st.integers(1, 6), st.integers(1, 3)), min_size=2, max_size=2))
def test_pages_share_memory_exactly_when_a_byte_is_shared(views):
    """Property: the aliasing test agrees with the set of bytes each page covers wherever the
    pages step through memory alike (one layout's pages; a page of one row); with strides that
    differ it may refuse spans that interleave, but never misses a shared byte."""
    from lola.engine.state_pages import _overlap

    buf = torch.zeros(6 * 48)
    pages = []
    for offset, width, rows, row_stride in views:
        width = min(width, 48 - offset)
        pages.append(buf.as_strided((min(rows, 6 // row_stride or 1), width), (48 * row_stride, 1), offset))

    def cells(t):
        return {t.storage_offset() + i * t.stride(0) + j for i in range(t.shape[0]) for j in range(t.shape[1])}

    shared = bool(cells(pages[0]) & cells(pages[1]))
    if pages[0].stride(0) == pages[1].stride(0) or 1 in (pages[0].shape[0], pages[1].shape[0]):
        assert _overlap(*pages) == shared
    else:
        assert _overlap(*pages) or not shared


def test_a_page_has_one_owner():
    """Two live states bound to one row would overwrite each other: the second bind is refused,
    naming the rows; once the first is released, reset or dropped, the row is free again."""
    attn, first, pages = _bound_state()
    first.bind_pages(pages, torch.tensor([1, 2]), seen=torch.tensor([0, 0]))
    second = attn.new_state()
    with pytest.raises(ValueError, match=r"pages \[2\] are bound to another state .*release that state first"):
        second.bind_pages(pages, torch.tensor([2, 4]), seen=torch.tensor([0, 0]))
    assert second.bound_pages is None
    second.bind_pages(pages, torch.tensor([3, 0]), seen=torch.tensor([0, 0]))  # other rows: fine
    first.bind_pages(pages, torch.tensor([2, 1]), seen=torch.tensor([0, 0]))  # the owner binds its rows again: fine
    # a view of the same buffer names the same rows by their bytes
    view = {key: t[2:] for key, t in pages.items()}
    with pytest.raises(ValueError, match=r"pages \[0\] are bound to another state"):
        attn.new_state().bind_pages(view, torch.tensor([0]), seen=torch.tensor([0]))
    # another buffer of the same layout is another set of pages
    attn.new_state().bind_pages({key: t.clone() for key, t in pages.items()}, torch.tensor([1, 2]), seen=torch.tensor([0, 0]))

    first.release_pages()
    assert first.bound_pages is None and not first.allocated
    third = attn.new_state()
    third.bind_pages(pages, torch.tensor([1, 2]), seen=torch.tensor([0, 0]))
    del third  # dropped: it owns nothing
    attn.new_state().bind_pages(pages, torch.tensor([2]), seen=torch.tensor([0]))
    second.reset()
    attn.new_state().bind_pages(pages, torch.tensor([3]), seen=torch.tensor([0]))


def test_a_released_state_leaves_its_pages_current():
    attn, state, pages = _bound_state()
    q, k, v = (torch.randn(1, 9, n, D) for n in (H, HKV, HKV))
    with torch.no_grad():
        state.bind_pages(pages, torch.tensor([4]), seen=torch.tensor([0]))
        attn(q[:, :6], k[:, :6], v[:, :6], state=state)
        held = {key: t[4].clone() for key, t in pages.items()}
        state.release_pages()
        assert all(torch.equal(pages[key][4], t) for key, t in held.items())
        # the pages continue the sequence in a state bound anew
        again = attn.new_state()
        again.bind_pages(pages, torch.tensor([4]), seen=torch.tensor([6]))
        out, _ = attn(q[:, 6:], k[:, 6:], v[:, 6:], state=again)
        expected, _ = attn(q, k, v)
    torch.testing.assert_close(out, expected[:, 6:], rtol=1e-5, atol=1e-6)
