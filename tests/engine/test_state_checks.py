"""The state's checks (lola.engine.state_checks): what a run could have written passes, each
kind of state no run writes is refused with the tensor named, row indices are checked."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola
from lola.engine.state_checks import check_row_index, check_state, layout_of


def _saved_state(seed=0):
    cfg = lola.LoLAConfig(window=4, sparse_size=3, sinks=1, chunk=3, policy="recency")
    attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(2, 13, 4, 8, generator=g), torch.randn(2, 13, 2, 8, generator=g), torch.randn(2, 13, 2, 8, generator=g)
    with torch.no_grad():
        _, state = attn(q, k, v)
    return attn, state, {name: t.clone() for name, t in state.state_dict().items()}


def test_a_saved_state_passes_with_and_without_its_memory():
    attn, state, saved = _saved_state()
    check_state(saved)
    check_state(saved, attn.new_state())  # an unallocated memory of the same layer
    check_state(saved, state)


def test_layout_of_reads_the_geometry_a_state_claims():
    _, _, saved = _saved_state()
    layout = layout_of(saved, "linear", "window")
    assert (layout.num_heads, layout.storage_heads, layout.head_dim) == (4, 2, 8)
    assert layout.feature_dim == saved["linear.H"].shape[2]
    assert layout_of({k: t for k, t in saved.items() if k != "linear.H"}, "linear", "window") is None


def _edited(saved, key, edit):
    out = {k: t.clone() for k, t in saved.items()}
    out[key] = edit(out[key])
    return out


@pytest.mark.parametrize(
    "key, edit, message",
    [
        ("seen", lambda t: t - 100, "seen"),
        ("linear.H", lambda t: t.fill_(float("nan")), "linear.H"),
        ("window.pos", lambda t: t.fill_(10**6), "window.pos"),
        ("sparse.k", lambda t: t[:, :1], "sparse.k"),
        ("window.v", lambda t: t.double(), "window.v"),
    ],
    ids=["negative count", "NaN state", "positions after seen", "a head missing", "another dtype"],
)
def test_a_state_no_run_writes_is_refused_naming_the_tensor(key, edit, message):
    attn, _, saved = _saved_state()
    with pytest.raises(ValueError, match=message):
        check_state(_edited(saved, key, edit), attn.new_state())


def test_two_slots_holding_one_position_are_refused():
    attn, _, saved = _saved_state()
    # the window's newest token's position given to a sparse slot of the same row and head
    newest = saved["window.pos"].amax(dim=-1, keepdim=True)
    bad = _edited(saved, "sparse.pos", lambda t: torch.cat([newest, t[..., 1:]], dim=-1))
    with pytest.raises(ValueError, match="pos"):
        check_state(bad, attn.new_state())


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 6), index=st.lists(st.integers(-3, 8), max_size=8), repeats=st.booleans())
def test_check_row_index_accepts_exactly_the_rows_of_the_state(rows, index, repeats):
    tensor = torch.tensor(index, dtype=torch.long)
    ok = all(0 <= i < rows for i in index) and (repeats or len(set(index)) == len(index))
    if ok:
        out = check_row_index(tensor, rows, "index", repeats=repeats, device=torch.device("cpu"))
        assert out.dtype == torch.long and out.tolist() == index
    else:
        with pytest.raises(ValueError, match="index must"):
            check_row_index(tensor, rows, "index", repeats=repeats, device=torch.device("cpu"))


@pytest.mark.parametrize(
    "index, error",
    [([0, 1], TypeError), (torch.tensor([0.0]), TypeError), (torch.tensor([True]), TypeError), (torch.zeros(1, 1, dtype=torch.long), ValueError)],
    ids=["a list", "floats", "booleans", "two dimensions"],
)
def test_check_row_index_refuses_what_is_not_a_1d_int_tensor(index, error):
    with pytest.raises(error, match="rows"):
        check_row_index(index, 4, "rows_to_keep", repeats=True, device=torch.device("cpu"))


def _layer(window_cls, linear_cls):
    from lola.feature_maps import build_feature_map
    from lola.memory import SinkTokens, SparseCache
    from lola.policies import Recency
    from lola.schedules import Chunkwise

    def memory():
        return lola.LoLAMemory(
            sinks=SinkTokens(1), window=window_cls(4, max_pending=3), sparse=SparseCache(3), linear=linear_cls(), policy=Recency(), schedule=Chunkwise(3)
        )

    torch.manual_seed(0)
    fmap = lambda: build_feature_map("hedgehog", 4, 8, 8)  # noqa: E731  (non-negative features)
    attn = lola.LoLAAttention(4, 8, num_kv_heads=2, memory_factory=memory, feature_map_q=fmap(), feature_map_k=fmap())
    q, k, v = torch.randn(1, 13, 4, 8), torch.randn(1, 13, 2, 8), torch.randn(1, 13, 2, 8)
    with torch.no_grad():
        _, state = attn(q, k, v)
    return attn, {name: t.clone() for name, t in state.state_dict().items()}


def test_the_checks_a_memory_declares_are_the_ones_applied():
    """A negative normaliser and a window of other than its newest tokens are refused for the stock
    memories (they declare `sums_features` and `ring`); a subclass that writes its own way and
    does not declare them again is not held to them."""
    from lola.memory import LinearState, SlidingWindow

    class OwnWrite(LinearState):
        def write(self, *args, **kwargs):
            return super().write(*args, **kwargs)

    class OwnAppend(SlidingWindow):
        def append(self, *args, **kwargs):
            return super().append(*args, **kwargs)

    def negative_s(saved):
        return _edited(saved, "linear.s", lambda t: -t.abs() - 1)

    def window_with_a_gap(saved):
        # the window's oldest token swapped for a folded one (position 2): unique, but not the newest
        return _edited(saved, "window.pos", lambda t: torch.where(t == t[t >= 0].min(), 2, t))

    stock, saved = _layer(SlidingWindow, LinearState)
    with pytest.raises(ValueError, match="linear.s"):
        check_state(negative_s(saved), stock.new_state())
    with pytest.raises(ValueError, match="newest tokens"):
        check_state(window_with_a_gap(saved), stock.new_state())
    custom, saved = _layer(OwnAppend, OwnWrite)
    check_state(negative_s(saved), custom.new_state())
    check_state(window_with_a_gap(saved), custom.new_state())


def test_a_ragged_sparse_run_may_hold_one_token_in_two_heads():
    """A saved sparse cache with per-head sizes is one run ``[B, 1, Σ λ_h]``: two heads keeping the
    same token is no repeat (each head's range is checked on its own), a token twice in one
    head's range is."""
    import lola

    cfg = lola.LoLAConfig(window=4, chunk=4, sparse_size_per_head=[4, 1], sinks=1)
    attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
    found = False
    for seed in range(8):
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(2, 20, n, 8, generator=g) for n in (4, 2, 2))
        with torch.no_grad():
            _, state = attn(q, k, v)
        saved = state.state_dict()
        pos = saved["sparse.pos"]
        shared = (pos[:, 0, 4:5] >= 0) & (pos[:, 0, :4] == pos[:, 0, 4:5]).any(-1, keepdim=True)
        attn.new_state().load_state_dict(saved)  # checked: no error
        if bool(shared.any()):
            found = True
            bad = dict(saved, **{"sparse.pos": pos.clone()})
            bad["sparse.pos"][:, 0, 1] = bad["sparse.pos"][:, 0, 0]
            if bool((bad["sparse.pos"][:, 0, 0] >= 0).all()):
                with pytest.raises(ValueError, match="held twice"):
                    attn.new_state().load_state_dict(bad)
    assert found, "no seed kept one token in both heads: the case is not exercised"
