import contextlib

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import lola
from lola.memory import LinearState, SinkTokens, SlidingWindow, SparseCache
from lola.policies import SelfRecallError
from lola.schedules import Chunkwise
from tests.oracles import assert_rel_close, causal_softmax, smooth_directional_derivative

CFG = lola.LoLAConfig(window=4, sparse_size=4, sinks=2, chunk=3)


def inputs(b=2, t=20, h=4, h_kv=2, d=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, t, h, d, generator=g).to(dtype),
        torch.randn(b, t, h_kv, d, generator=g).to(dtype),
        torch.randn(b, t, h_kv, d, generator=g).to(dtype),
    )


@pytest.fixture
def attn():
    return lola.compose(CFG, num_heads=4, head_dim=8, num_kv_heads=2)


def test_issue_example_runs():
    cfg = lola.LoLAConfig(window=64, sparse_size=64, sinks=4, chunk=64, policy="sre", schedule="chunkwise", feature_map="hedgehog_identity", mixing="lolcats")
    attn = lola.compose(cfg, num_heads=8, head_dim=64)
    assert isinstance(attn, torch.nn.Module)
    q, k, v = inputs(b=1, t=300, h=8, h_kv=8, d=64)
    o, state = attn(q, k, v)
    o2, state = attn(q[:, :1], k[:, :1], v[:, :1], state=state)
    assert o.shape == q.shape and o2.shape == (1, 1, 8, 64)
    assert state.nbytes() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_output_dtype_and_fp32_state(attn, dtype):
    q, k, v = inputs(dtype=dtype)
    o, state = attn(q, k, v)
    assert o.dtype == dtype and o.shape == q.shape and torch.isfinite(o).all()
    assert state.linear.H.dtype == torch.float32 and state.window.block.k.dtype == dtype
    ref, _ = attn(*(x.float() for x in (q, k, v)))
    assert_rel_close(ref, o.float(), 2e-2 if dtype != torch.float32 else 1e-6)


def test_scale_option():
    cfg = lola.LoLAConfig(window=30, sparse_size=0, sinks=0, scale=0.3)
    a = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
    q, k, v = inputs()
    o, _ = a(q, k, v)
    assert_rel_close(causal_softmax(q, k, v, 0.3), o, 1e-5)


def test_state_dict_round_trip_is_bit_exact(attn):
    q, k, v = inputs(t=40)
    _, state = attn(q[:, :23], k[:, :23], v[:, :23])
    saved = {n: x.clone() for n, x in state.state_dict().items()}
    o_cont, _ = attn(q[:, 23:], k[:, 23:], v[:, 23:], state=state)
    fresh_layer = lola.compose(CFG, num_heads=4, head_dim=8, num_kv_heads=2)
    fresh_layer.load_state_dict(attn.state_dict())
    restored = fresh_layer.new_state()
    restored.load_state_dict(saved)
    o_rest, _ = fresh_layer(q[:, 23:], k[:, 23:], v[:, 23:], state=restored)
    assert torch.equal(o_cont, o_rest)


def test_nbytes_is_constant_once_allocated(attn):
    q, k, v = inputs(t=10)
    _, state = attn(q, k, v)
    n0 = state.nbytes()
    for _ in range(5):
        _, state = attn(q, k, v, state=state)
    assert state.nbytes() == n0
    b, hs, d, h = 2, 2, 8, 4
    exact_slots = CFG.sinks + (CFG.window + CFG.chunk) + CFG.sparse_size
    expected = b * hs * exact_slots * (2 * d * 4 + 8) + b * h * (attn.feature_dim * d + attn.feature_dim) * 4 + b * 8
    assert n0 == expected


def test_query_head_storage_costs_group_times_more_exact_bytes():
    q, k, v = inputs()
    a_kv = lola.compose(CFG, num_heads=4, head_dim=8, num_kv_heads=2)
    a_q = lola.compose(CFG.model_copy(update={"gqa_storage": "query_head"}), num_heads=4, head_dim=8, num_kv_heads=2)
    _, s_kv = a_kv(q, k, v)
    _, s_q = a_q(q, k, v)
    exact = lambda s: sum(m.nbytes() for m in s.exact_memories)  # noqa: E731
    assert exact(s_q) == 2 * exact(s_kv)


def test_custom_cache_from_parts():
    memory = lambda: lola.LoLAMemory(  # noqa: E731
        sinks=SinkTokens(1),
        window=SlidingWindow(3, max_pending=2),
        sparse=SparseCache(2),
        linear=LinearState(),
        policy=SelfRecallError(eps=1e-4),
        schedule=Chunkwise(2),
    )
    from lola.feature_maps import EluFeatureMap

    attn = lola.LoLAAttention(4, 8, 2, memory_factory=memory, feature_map_q=EluFeatureMap(4, 8), feature_map_k=EluFeatureMap(4, 8), mixing="lola_authors")
    q, k, v = inputs()
    o, state = attn(q, k, v)
    assert torch.isfinite(o).all() and int(state.seen[0]) == 20
    # the same sequence with nothing evicted is exact softmax
    big = lambda: lola.LoLAMemory(window=SlidingWindow(20, 2), sparse=SparseCache(0), policy=SelfRecallError(), schedule=Chunkwise(2))  # noqa: E731
    exact = lola.LoLAAttention(4, 8, 2, memory_factory=big, feature_map_q=EluFeatureMap(4, 8), feature_map_k=EluFeatureMap(4, 8))
    assert_rel_close(causal_softmax(q, k, v, exact.scale), exact(q, k, v)[0], 1e-5)


def test_window_must_buffer_a_whole_period():
    with pytest.raises(ValueError, match="max_pending"):
        lola.LoLAMemory(window=SlidingWindow(3, max_pending=1), sparse=SparseCache(2), policy=SelfRecallError(), schedule=Chunkwise(4))


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "mutate, err, match",
    [
        (lambda q, k, v: (q[0], k, v), ValueError, "q must be"),
        (lambda q, k, v: (q, k[:1], v), ValueError, "k must be"),
        (lambda q, k, v: (q, k, v[:, :5]), ValueError, "v must be"),
        (lambda q, k, v: (q[..., :6], k, v), ValueError, r"q must be \[B, T, 4, 8\]"),
        (lambda q, k, v: (q, k[..., :6], v), ValueError, "k must be"),
        (lambda q, k, v: (q, k.double(), v), TypeError, "dtype"),
        (lambda q, k, v: (q, k, v.long()), TypeError, "floating"),
        (lambda q, k, v: (q[:, :0], k[:, :0], v[:, :0]), ValueError, "T >= 1"),
        (lambda q, k, v: (q[:0], k[:0], v[:0]), ValueError, r"at least one row \(B >= 1\), got an empty batch"),
        (lambda q, k, v: (q.clone().index_fill_(1, torch.tensor([3]), float("nan")), k, v), ValueError, "q contains non-finite"),
        (lambda q, k, v: (q, k.clone().index_fill_(1, torch.tensor([3]), float("inf")), v), ValueError, "k contains non-finite"),
        (lambda q, k, v: ("q", k, v), TypeError, "q must be a torch.Tensor"),
    ],
)
def test_bad_tensors(attn, mutate, err, match):
    with pytest.raises(err, match=match):
        attn(*mutate(*inputs()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_finite_inputs_whose_sum_overflows_are_accepted_and_a_decoded_nan_is_named(attn, dtype):
    """The finiteness check sums the inputs: values near the dtype's largest are finite though
    their sum is not, and are not refused (what the layer makes of them is another matter); a
    NaN in one decoded token's ``v`` is named."""
    q, k, v = inputs(dtype=dtype)
    big = torch.finfo(dtype).max / 2
    with torch.no_grad():
        _, state = attn(q, k, v.clone().fill_(big))
        with pytest.raises(ValueError, match="v contains non-finite"):
            attn(q[:, :1], k[:, :1], v[:, :1].clone().fill_(float("nan")), state=state)


def test_heads_must_divide():
    with pytest.raises(ValueError, match="multiple"):
        lola.compose(CFG, num_heads=4, head_dim=8, num_kv_heads=3)


def test_bad_padding_mask(attn):
    q, k, v = inputs()
    with pytest.raises(ValueError, match="padding_mask"):
        attn(q, k, v, padding_mask=torch.ones(2, 19, dtype=torch.bool))
    with pytest.raises(ValueError, match="padding_mask"):
        attn(q, k, v, padding_mask=torch.full((2, 20), 2))
    o_int, _ = attn(q, k, v, padding_mask=torch.ones(2, 20, dtype=torch.long))
    o_bool, _ = attn(q, k, v)
    assert torch.equal(o_int, o_bool)


def test_state_from_another_config_or_batch_is_refused(attn):
    q, k, v = inputs()
    _, state = attn(q, k, v)
    other = lola.compose(CFG.model_copy(update={"window": 5}), num_heads=4, head_dim=8, num_kv_heads=2)
    with pytest.raises(ValueError, match="another configuration"):
        other(q, k, v, state=state)
    with pytest.raises(ValueError, match="rows"):
        attn(q[:1], k[:1], v[:1], state=state)
    with pytest.raises(TypeError, match="state stores"):
        attn(q.half(), k.half(), v.half(), state=state)
    with pytest.raises(TypeError, match="LoLAMemory"):
        attn(q, k, v, state={"H": 1})
    wider = lola.compose(CFG, num_heads=4, head_dim=8, num_kv_heads=4)
    with pytest.raises(ValueError, match="state stores"):
        wider(q, torch.cat([k, k], 2), torch.cat([v, v], 2), state=state)


def test_state_dict_with_unknown_keys_is_refused(attn):
    _, state = attn(*inputs())
    sd = dict(state.state_dict())
    sd["bogus"] = torch.zeros(1)
    with pytest.raises(ValueError, match="bogus"):
        attn.new_state().load_state_dict(sd)


def test_gradients_reach_feature_maps_and_window_factors():
    cfg = lola.LoLAConfig(window=2, sparse_size=2, sinks=1, chunk=2, feature_map="hedgehog", mixing="lolcats")
    attn = lola.compose(cfg, num_heads=2, head_dim=8)
    q, k, v = inputs(h=2, h_kv=2)
    o, _ = attn(q, k, v)
    o.square().mean().backward()
    for name, p in attn.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    mixing=st.sampled_from(["lola_authors", "lolcats", "softmax_only"]),
    sparse_size=st.integers(0, 4),
    schedule=st.sampled_from(["chunkwise", "tokenwise"]),
)
def test_gradients_through_the_engine_are_those_of_its_outputs(seed, mixing, sparse_size, schedule):
    """Stage 2 trains through the inference path (``FinetuneConfig.lola``): autograd's derivative
    of the layer, along a random direction of every input and parameter at once, equals the
    finite-difference derivative of its outputs (the selection is piecewise constant: the step is
    small enough not to change it; the engine computes in float32, hence float64 inputs and a
    step of 2e-3 with Richardson's extrapolation, whose truncation error is below float32's rounding)."""
    cfg = lola.LoLAConfig(window=3, sparse_size=sparse_size, sinks=1, chunk=3, schedule=schedule, mixing=mixing, feature_map="hedgehog", feature_dim=6)
    torch.manual_seed(seed)
    attn = lola.compose(cfg, num_heads=2, head_dim=4, num_kv_heads=1).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(0.3 * torch.randn_like(p))  # away from the initialisation's symmetries
    q, k, v = (x.double() for x in inputs(b=1, t=15, h=2, h_kv=1, d=4, seed=seed))
    xs = [q, k, v, *attn.parameters()]
    direction = [torch.randn_like(x) for x in xs]
    weights = torch.randn(1, 15, 2, 4, dtype=torch.float64)

    def loss(tensors, grad):
        qq, kk, vv, *params = tensors
        with torch.no_grad():
            for p, value in zip(attn.parameters(), params):
                p.copy_(value)
        with torch.set_grad_enabled(grad):
            y, state = attn(qq, kk, vv)
            held = torch.cat([m.block.pos.flatten() for m in state.exact_memories if m.capacity])
            return (y * weights).sum(), held.sort().values

    leaves = [x.detach().clone().requires_grad_(True) for x in xs[:3]]
    start = [x.detach().clone() for x in xs]
    out, kept = loss(leaves + start[3:], True)
    for p in attn.parameters():
        p.grad = None
    out.backward()
    grads = [x.grad for x in leaves] + [p.grad for p in attn.parameters()]
    analytic = sum(float((g * d).sum()) for g, d in zip(grads, direction) if g is not None)

    def along(t):
        value, kept_t = loss([x + t * d for x, d in zip(start, direction)], False)
        # A near-tie of scores can flip a selection within the step: the outputs then jump.
        assume(torch.equal(kept_t, kept))
        return value

    # A near-tie of the largest logits (the lolcats rules read the exact part relative to its
    # max) puts a kink within the step, and a selection that differs only mid-sequence a jump:
    # there is no derivative to compare with there, and such examples are skipped.
    numeric = smooth_directional_derivative(along, h=2e-3, tol=3e-3)
    assume(numeric is not None)
    assert analytic == pytest.approx(numeric, rel=3e-3, abs=3e-3)


@pytest.mark.parametrize("storage", ["kv_head", "query_head"])
def test_per_head_budgets_equal_separate_heads(storage):
    # Two heads with their own window and sparse sizes behave exactly like two one-head layers.
    windows, sparses = [3, 7], [5, 2]
    common = dict(sinks=1, chunk=3, policy="sre", gqa_storage=storage)
    both = lola.compose(lola.LoLAConfig(window_per_head=windows, sparse_size_per_head=sparses, **common), num_heads=2, head_dim=8)
    q, k, v = inputs(b=2, t=40, h=2, h_kv=2)
    o, state = both(q, k, v)
    for h in range(2):
        one = lola.compose(lola.LoLAConfig(window=windows[h], sparse_size=sparses[h], **common), num_heads=1, head_dim=8)
        o_h, s_h = one(q[:, :, h : h + 1], k[:, :, h : h + 1], v[:, :, h : h + 1])
        assert_rel_close(o_h[:, :, 0], o[:, :, h], 1e-5, f"head {h}")
        assert int((state.sparse.block.pos[:, h] >= 0).sum()) == int((s_h.sparse.block.pos >= 0).sum())


def test_per_head_sizes_must_match_the_storage_heads():
    with pytest.raises(ValueError, match="window_per_head"):
        lola.compose(lola.LoLAConfig(window_per_head=[1, 2, 3]), num_heads=4, head_dim=8, num_kv_heads=2)
    with pytest.raises(ValueError, match="sparse_size_per_head"):
        lola.compose(lola.LoLAConfig(sparse_size_per_head=[1, 2], gqa_storage="query_head"), num_heads=4, head_dim=8, num_kv_heads=2)


def test_per_head_sparse_sizes_with_gqa_resume_exactly():
    # Ragged sparse storage (a streaming head with no sparse slots) survives save, load and
    # split-and-resume: the state bit for bit, the outputs to rounding (the query a step falls
    # on is read with the next block's queries, or alone when the call ends on it: the
    # matmuls' shapes differ), and a GQA group reads its own head's slots.
    cfg = lola.LoLAConfig(window=3, sparse_size_per_head=[5, 0], sinks=1, chunk=4)
    attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
    q, k, v = inputs(b=2, t=33, h=4, h_kv=2)
    o, whole = attn(q, k, v)
    o1, part = attn(q[:, :20], k[:, :20], v[:, :20])
    resumed = attn.new_state()
    resumed.load_state_dict(part.state_dict())
    o2, resumed = attn(q[:, 20:], k[:, 20:], v[:, 20:], state=resumed)
    assert_rel_close(torch.cat([o1, o2], dim=1), o, 1e-6, "split and resumed")
    for key, t in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], t), key
    assert whole.state_dict()["sparse.k"].shape == (2, 1, 5, 8)
    for h in range(2):  # each K/V head's group equals a 2-query-head layer with that head's size alone
        one = lola.compose(lola.LoLAConfig(window=3, sparse_size=[5, 0][h], sinks=1, chunk=4), num_heads=2, head_dim=8, num_kv_heads=1)
        o_h, _ = one(q[:, :, 2 * h : 2 * h + 2], k[:, :, h : h + 1], v[:, :, h : h + 1])
        assert_rel_close(o_h, o[:, :, 2 * h : 2 * h + 2], 1e-5, f"kv head {h}")


def test_state_is_float32_whatever_the_default_dtype():
    """Serving engines build models under torch.set_default_dtype(bf16): the linear state and
    the partials stay float32 (a bf16 state would round the history away)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        cfg = lola.LoLAConfig(window=4, sparse_size=4, sinks=1, chunk=4, mixing="lolcats", policy="attention")
        attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2).to(torch.float32)
        q, k, v = torch.randn(2, 17, 4, 8, dtype=torch.bfloat16), torch.randn(2, 17, 2, 8, dtype=torch.bfloat16), torch.randn(2, 17, 2, 8, dtype=torch.bfloat16)
        mask = torch.ones(2, 17, dtype=torch.bool)
        mask[0, :3] = False
        o, state = attn(q, k, v, padding_mask=mask)
    finally:
        torch.set_default_dtype(previous)
    assert state.linear.state[0].dtype == state.linear.state[1].dtype == torch.float32
    assert state.window.block.acc.dtype == torch.float32 and o.dtype == torch.bfloat16
    assert bool(torch.isfinite(o).all())


@pytest.mark.parametrize("mixing", ["lolcats", "lola_authors", "softmax_only"])
def test_observing_the_linear_share_changes_no_output(mixing):
    """observe_linear_share sees every call (prefill and decode tokens, which then take the unfused
    path) with α in [0, 1] per head and token, and the outputs are those of the fused path."""
    from lola.layer import observe_linear_share

    cfg = lola.LoLAConfig(window=4, sparse_size=3, sinks=1, chunk=2, mixing=mixing, feature_map="hedgehog", feature_dim=4)
    attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
    torch.nn.init.normal_(attn.window_factors)
    q, k, v = inputs(t=21)
    seen = []
    record = lambda layer, share, valid: seen.append((layer, share.clone(), valid.clone()))  # noqa: E731

    def run(observe: bool):
        o, state = attn(q[:, :17], k[:, :17], v[:, :17])
        outs = [o]
        for t in range(17, 21):
            if observe:
                with observe_linear_share(record):
                    outs.append(attn(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], state=state)[0])
            else:
                outs.append(attn(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], state=state)[0])
        return torch.cat(outs, 1)

    torch.testing.assert_close(run(observe=True), run(observe=False), rtol=1e-5, atol=1e-6)
    assert len(seen) == 4 and all(layer is attn for layer, _, _ in seen)
    for _, share, valid in seen:
        assert share.shape == (2, 4, 1) and valid.shape == (2, 1) and bool(valid.all())
        assert bool(((share >= 0) & (share <= 1)).all())
        if mixing == "softmax_only":
            assert bool((share == 0).all())
        else:
            assert bool((share > 0).all())  # after 17 tokens the state holds evicted ones
    with observe_linear_share(record):
        pass
    n = len(seen)
    attn(q[:, :1], k[:, :1], v[:, :1])  # outside the block: not observed
    assert len(seen) == n


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), cap=st.sampled_from([0.02, 0.2]), decay=st.sampled_from([1.0, 0.95]))
def test_a_share_cap_bounds_the_state_and_decodes_as_it_prefills(seed, cap, decay):
    """Under the paper's rule with ``linear_share_cap``: decoding token by token (the fused
    decode step, which caps) gives the outputs of one prefill, no output takes more than the cap from the state,
    and a cap of 1 is no cap."""
    from lola.layer import observe_linear_share

    common = dict(window=3, sparse_size=2, sinks=1, chunk=4, mixing="lola_authors", linear_decay=decay)
    torch.manual_seed(seed)
    capped = lola.compose(lola.LoLAConfig(**common, linear_share_cap=cap), num_heads=4, head_dim=8, num_kv_heads=2)
    free = lola.compose(lola.LoLAConfig(**common, linear_share_cap=1.0), num_heads=4, head_dim=8, num_kv_heads=2)
    plain = lola.compose(lola.LoLAConfig(**common), num_heads=4, head_dim=8, num_kv_heads=2)
    with torch.no_grad():
        for m in (capped, free):
            m.load_state_dict(plain.state_dict())
            m.window_factors.fill_(-4.0)  # a small exact weight: the state's share exceeds the cap
        plain.window_factors.fill_(-4.0)
    q, k, v = inputs(b=2, t=24, seed=seed)
    shares = []
    with torch.no_grad(), observe_linear_share(lambda layer, share, valid: shares.append(share)):
        o, _ = capped(q, k, v)
    assert float(torch.cat([s.flatten() for s in shares]).max()) <= cap + 1e-6
    with torch.no_grad():
        o_first, state = capped(q[:, :18], k[:, :18], v[:, :18])
        steps = [capped(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)[0] for i in range(18, 24)]
        assert_rel_close(o, torch.cat([o_first, *steps], dim=1), 1e-5, "decode vs prefill")
        o_free, _ = free(q, k, v)
        o_plain, _ = plain(q, k, v)
    assert torch.equal(o_free, o_plain)
    assert not torch.allclose(o, o_plain)  # the cap changed something, so the checks above can fail


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), cap_from=st.integers(1, 12), pad=st.integers(1, 5))
def test_a_share_cap_from_a_position_counts_each_rows_real_tokens(seed, cap_from, pad):
    """``linear_share_cap_from``: a query's position is its row's count of real tokens, so a
    left-padded row is capped where it would be alone; queries before the position read as with
    no cap, from it on as with the cap."""
    common = dict(window=3, sparse_size=2, sinks=1, chunk=4, mixing="lola_authors")
    torch.manual_seed(seed)
    gated = lola.compose(lola.LoLAConfig(**common, linear_share_cap=0.02, linear_share_cap_from=cap_from), num_heads=4, head_dim=8, num_kv_heads=2)
    capped = lola.compose(lola.LoLAConfig(**common, linear_share_cap=0.02), num_heads=4, head_dim=8, num_kv_heads=2)
    plain = lola.compose(lola.LoLAConfig(**common), num_heads=4, head_dim=8, num_kv_heads=2)
    with torch.no_grad():
        for m in (gated, capped):
            m.load_state_dict(plain.state_dict())
        for m in (gated, capped, plain):
            m.window_factors.fill_(-4.0)  # the state's share exceeds the cap
    q, k, v = inputs(b=2, t=18, seed=seed)
    mask = torch.ones(2, 18, dtype=torch.bool)
    mask[1, :pad] = False
    with torch.no_grad():
        o, _ = gated(q, k, v, padding_mask=mask)
        alone, _ = gated(q[1:, pad:], k[1:, pad:], v[1:, pad:])
        o_capped, o_plain = capped(q[:1], k[:1], v[:1])[0], plain(q[:1], k[:1], v[:1])[0]
    assert_rel_close(alone, o[1:, pad:], 1e-5, "padded row vs alone")
    assert torch.equal(o[:1, :cap_from], o_plain[:, :cap_from])
    assert_rel_close(o_capped[:, cap_from:], o[:1, cap_from:], 1e-6, "capped from the position on")
    assert not torch.allclose(o_capped[:, cap_from:], o_plain[:, cap_from:])  # the cap changed something there


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), cap_from=st.integers(0, 22), mixing=st.sampled_from(["lola_authors", "lolcats"]))
def test_a_capped_decode_takes_the_fused_step_and_equals_the_unfused_path(seed, cap_from, mixing):
    """With a share cap (from a position or not), each decoded token is read, mixed and capped
    by one ``decode_step`` call, and gives what the unfused path gives (the path a token takes
    while an observer watches: ``attend`` + ``mix``)."""
    from lola.kernels import record_calls
    from lola.layer import observe_linear_share

    cfg = lola.LoLAConfig(window=3, sparse_size=2, sinks=1, chunk=4, mixing=mixing, linear_share_cap=0.05, linear_share_cap_from=cap_from)
    torch.manual_seed(seed)
    attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
    with torch.no_grad():
        attn.window_factors.fill_(-4.0)  # the state's share exceeds the cap
    q, k, v = inputs(b=2, t=24, seed=seed)
    outs = {}
    with torch.no_grad():
        for path in ("fused", "unfused"):
            _, state = attn(q[:, :16], k[:, :16], v[:, :16])
            with record_calls() as calls, observe_linear_share(lambda *a: None) if path == "unfused" else contextlib.nullcontext():
                outs[path] = torch.cat([attn(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)[0] for i in range(16, 24)], dim=1)
            assert (sum(n for (op, _), n in calls.items() if op == "decode_step") == 8) == (path == "fused")
    assert_rel_close(outs["unfused"], outs["fused"], 1e-5, "fused vs unfused capped decode")
