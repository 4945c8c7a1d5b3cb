"""The engine runs on lola.kernels: prefill and decode dispatch the kernels, and the fused
decode step equals the general path."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola
from lola import kernels as K
from lola.core import mix
from tests.oracles import assert_rel_close
from tests.strategies import memory_sizes, seeds, storages


def _inputs(b, t, h, hkv, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, h, d, generator=g), torch.randn(b, t, hkv, d, generator=g), torch.randn(b, t, hkv, d, generator=g)


def _drawn_layer(cfg: lola.LoLAConfig, seed: int) -> lola.LoLAAttention:
    """The layer of the drawn tests: 4 query heads, 2 K/V heads, head size 8, weights from ``seed``."""
    torch.manual_seed(seed)
    return lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)


def test_the_hybrid_linear_part_is_one_chunk_linear_attention_call():
    from lola.linearize.hybrid import hybrid_attention

    b, h, t, d, f = 2, 3, 37, 8, 6
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d, generator=g) for _ in range(3))
    fq, fk = (torch.rand(b, h, t, f, generator=g) for _ in range(2))
    with K.record_calls() as calls:
        hybrid_attention(q, k, v, fq, fk, torch.full((h,), 0.3), window=5, scale=0.3)
    assert calls == {("chunk_linear_attention", "reference"): 1}


def test_decode_is_one_decode_step_call_per_token():
    cfg = lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=8)
    attn = lola.compose(cfg, num_heads=4, head_dim=16, num_kv_heads=2)
    q, k, v = _inputs(2, 30, 4, 2, 16)
    _, state = attn(q[:, :20], k[:, :20], v[:, :20])
    per_token = []
    for i in range(20, 30):
        with K.record_calls() as calls:
            attn(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)
        per_token.append({op: n for (op, _), n in calls.items()})
    for i, ops in zip(range(20, 30), per_token):
        step = (i + 1) % 8 == 0  # the step falls on positions 23 and 31
        expected = {"decode_step": 1} | ({"self_recall_error": 1} if step else {})
        assert ops == expected, (i, ops)


def test_record_calls_names_the_backend_and_nests():
    x = torch.randn(1, 2, 3, 4)
    pos = torch.zeros(1, 3, dtype=torch.long)
    kpos = torch.zeros(1, 2, 3, dtype=torch.long)
    with K.use_backend("reference"), K.record_calls() as outer:
        K.softmax_partial(x, x, x, pos, kpos, 1.0)
        with K.record_calls() as inner:
            K.softmax_partial(x, x, x, pos, kpos, 1.0)
    assert outer == {("softmax_partial", "reference"): 2}
    assert inner == {("softmax_partial", "reference"): 1}


@settings(max_examples=25, deadline=None)
@given(
    sizes=memory_sizes(window=(1, 6), sparse=(0, 5), sinks=(0, 3), chunk=(1, 6)),
    mixing=st.sampled_from(["lolcats", "lola_authors", "softmax_only"]),
    affine=st.booleans(),
    storage=storages,
    prefill=st.integers(1, 12),
    pad=st.integers(0, 3),
    seed=seeds,
)
def test_fused_decode_equals_attend_then_mix(sizes, mixing, affine, storage, prefill, pad, seed):
    """Row 0 is left-padded by ``pad`` tokens, so rows decode at different positions."""
    cfg = lola.LoLAConfig(**sizes, mixing=mixing, affine=affine and mixing == "lolcats", gqa_storage=storage)
    attn = _drawn_layer(cfg, seed)
    with torch.no_grad():
        attn.window_factors.normal_()
    q, k, v = _inputs(2, prefill + 6, 4, 2, 8, seed)
    mask = torch.ones(2, prefill, dtype=torch.bool)
    mask[0, : min(pad, prefill - 1)] = False
    _, fused = attn(q[:, :prefill], k[:, :prefill], v[:, :prefill], padding_mask=mask)
    general = attn.new_state()
    general.allocate(2, 4, attn.storage_heads(fused), 8, attn.feature_dim, k.dtype, k.device)
    general.load_state_dict(fused.state_dict())
    gate = torch.sigmoid(attn.window_factors.float()).view(-1)
    for i in range(prefill, prefill + 6):
        qi, ki, vi = q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1]
        o_fused, _ = attn(qi, ki, vi, state=fused)
        kh, vh = ki.transpose(1, 2), vi.transpose(1, 2)
        if storage == "query_head":
            kh, vh = kh.repeat_interleave(2, dim=1), vh.repeat_interleave(2, dim=1)
        qh = qi.transpose(1, 2)
        e, lin = general.attend(qh, attn.feature_map_q(qh), kh, vh, torch.ones(2, 1, dtype=torch.bool), attn.scale, attn.feature_map_k)
        o_general = mix(e, lin, gate, cfg.mixing, cfg.affine).transpose(1, 2)
        torch.testing.assert_close(o_fused, o_general, rtol=1e-5, atol=1e-5)
    for key, t in fused.state_dict().items():
        torch.testing.assert_close(t, general.state_dict()[key], msg=key)


@pytest.mark.parametrize("op", ["chunk_linear_attention", "softmax_partial", "self_recall_error", "decode_step"])
def test_every_op_under_forced_triton_keeps_its_gradients(op, monkeypatch):
    """Inputs that need gradients run the differentiable reference, whatever was requested."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter case")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    g = torch.Generator().manual_seed(3)
    B, H, Hs, N, F, D = 2, 4, 2, 5, 6, 8
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    pos = torch.arange(N).expand(B, Hs, N).contiguous()
    args = {
        "chunk_linear_attention": lambda x: K.chunk_linear_attention(x[0].abs(), x[1].abs(), x[2])[:2],
        "softmax_partial": lambda x: K.softmax_partial(x[0], x[1], x[2], torch.full((B, 3), N), pos, 0.5),
        "self_recall_error": lambda x: (K.self_recall_error(x[0].abs(), x[1], x[2], x[3].abs() + 1),),
        "decode_step": lambda x: (K.decode_step(x[0], x[1], x[2], pos, x[3].abs(), x[4], x[5].abs() + 1, torch.full((H,), 0.5), "lola_authors", 0.5),),
    }[op]
    shapes = {
        "chunk_linear_attention": [(B, N, H, F), (B, N, H, F), (B, N, H, D)],
        "softmax_partial": [(B, H, 3, D), (B, Hs, N, D), (B, Hs, N, D)],
        "self_recall_error": [(B, H, N, F), (B, H, N, D), (B, H, F, D), (B, H, F)],
        "decode_step": [(B, H, D), (B, Hs, N, D), (B, Hs, N, D), (B, H, F), (B, H, F, D), (B, H, F)],
    }[op]
    base = [r(*s) for s in shapes]

    def grads(backend):
        leaves = [t.clone().requires_grad_(True) for t in base]
        with K.use_backend(backend), K.record_calls() as calls:
            out = args(leaves)
        sum(o.square().sum() for o in out).backward()
        return [t.grad for t in leaves], calls

    ref, _ = grads("reference")
    forced, calls = grads("triton")
    assert calls == {(op, "reference"): 1}
    for a, b in zip(ref, forced):
        assert a is not None and b is not None
        torch.testing.assert_close(a, b)


def test_decode_under_autograd_has_the_gradients_of_one_call():
    """Token-by-token decode with inputs that need gradients (out-of-place ring writes) gives
    the gradients of the same tokens processed in one call."""
    cfg = lola.LoLAConfig(window=4, sparse_size=3, sinks=1, chunk=4, mixing="lolcats", feature_map="hedgehog", feature_dim=6)
    torch.manual_seed(0)
    attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
    base = _inputs(2, 14, 4, 2, 8, seed=5)

    def grads(split):
        attn.zero_grad()
        q, k, v = (t.clone().requires_grad_(True) for t in base)
        if split:
            o, state = attn(q[:, :8], k[:, :8], v[:, :8])
            outs = [attn(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)[0] for i in range(8, 14)]
            o = torch.cat(outs, dim=1)
        else:
            o = attn(q, k, v)[0][:, 8:]
        o.square().sum().backward()
        return [q.grad, k.grad, v.grad] + [p.grad.clone() for p in attn.parameters()]

    with K.record_calls() as calls:
        split = grads(True)
    assert calls[("decode_step", "reference")] == 6
    for a, b in zip(split, grads(False)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("sparse", [{"sparse_size": 4}, {"sparse_size_per_head": [6, 0]}], ids=["uniform", "per-head budgets"])
def test_decode_writes_in_place_between_steps(sparse):
    """Between two steps a decode token allocates nothing: the window's ring storage (a range of
    the layer's slot buffer, which the decode step reads as it is) keeps its memory, with
    uniform and with per-head sparse budgets."""
    cfg = lola.LoLAConfig(window=8, sinks=2, chunk=8, **sparse)
    attn = lola.compose(cfg, num_heads=4, head_dim=16, num_kv_heads=2)
    q, k, v = _inputs(2, 30, 4, 2, 16)
    with torch.inference_mode():
        _, state = attn(q[:, :17], k[:, :17], v[:, :17])
        attn(q[:, 17:18], k[:, 17:18], v[:, 17:18], state=state)  # builds the block
        storage = state.window.block.k.untyped_storage().data_ptr()
        block = state.exact_slots()
        for i in range(18, 23):  # the next step falls on position 23
            attn(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)
            assert state.window.block.k.untyped_storage().data_ptr() == storage
            assert state.exact_slots() is block
        held = sorted(int(p) for p in state.window.block.pos[0, 0] if p >= 0)
        assert held == list(range(23 - 8 - 7, 23))  # 8 kept at the step on 15, then 16..22


@pytest.mark.parametrize("mixing", ["softmax_only", "lola_authors"])
def test_the_engine_under_forced_triton_equals_the_reference(mixing, monkeypatch):
    """The tensors the engine hands the kernels (ring views, the block of exact slots, a decode
    gate) are valid Triton inputs: prefill + decode agree with the reference backend."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter case")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cfg = lola.LoLAConfig(window=4, sparse_size=3, sinks=1, chunk=4, mixing=mixing)
    attn = lola.compose(cfg, num_heads=4, head_dim=16, num_kv_heads=2)
    q, k, v = _inputs(1, 15, 4, 2, 16, seed=7)

    def run(backend):
        outs = []
        with torch.inference_mode(), K.use_backend(backend), K.record_calls() as calls:
            o, state = attn(q[:, :10], k[:, :10], v[:, :10])
            outs.append(o)
            for i in range(10, 15):
                outs.append(attn(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)[0])
        return torch.cat(outs, dim=1), {b for (_, b) in calls}

    ref, ref_backends = run("reference")
    tri, tri_backends = run("triton")
    assert ref_backends == {"reference"} and tri_backends == {"triton"}
    assert_rel_close(ref, tri, 1e-5)  # float32 both ways: only the order of sums differs


# -- no host reads per decoded token ------------------------------------------------------------------


@pytest.fixture
def accelerator_checks(monkeypatch):
    """lola's checks as they run on an accelerator (asynchronous asserts, nothing read back)."""
    import lola.core.checks as checks

    monkeypatch.setattr(checks, "HOST_DEVICES", frozenset())  # the CPU as an accelerator


@pytest.mark.parametrize("padded", [False, True], ids=["rows in step", "left-padded rows"])
def test_decode_reads_nothing_back_between_steps(accelerator_checks, padded):
    """The default decode path (check_inputs on, SRE, chunkwise) reads no tensor value back to
    the host on a token without a step; with a
    padded prefill the rows step at different tokens, and the schedule is still asked on the host."""
    from tests.host_reads import count_host_reads

    cfg = lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=8, policy="sre", mixing="lola_authors")
    attn = lola.compose(cfg, num_heads=4, head_dim=16, num_kv_heads=2)
    q, k, v = _inputs(2, 60, 4, 2, 16)
    mask = torch.ones(2, 30, dtype=torch.bool)
    if padded:
        mask[0, :3] = False
    _, state = attn(q[:, :30], k[:, :30], v[:, :30], padding_mask=mask)
    attn(q[:, 30:31], k[:, 30:31], v[:, 30:31], state=state)  # the first token reads the counts once
    seen = state.seen.tolist()
    for i in range(31, 60):
        with count_host_reads() as reads, K.record_calls() as calls:
            attn(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)
        steps = sum(n for (op, _), n in calls.items() if op == "self_recall_error")
        stepping = any((s + i - 31) % 8 == 7 for s in seen)  # a step falls on positions 7, 15, 23, …
        assert bool(steps) == stepping, i
        # at a step: the evicted count (a device read) and the schedule's next answer (computed
        # on host copies of the counts, a CPU tensor even when the state is on a GPU)
        assert sum(reads.values()) <= (2 if stepping else 0), (i, dict(reads))


@settings(max_examples=20, deadline=None)
@given(
    sizes=memory_sizes(window=(1, 5), sparse=(0, 5), sinks=(0, 3), chunk=(1, 6)),
    length=st.integers(1, 14),
    pad=st.integers(0, 3),
    offset=st.integers(0, 2),
    seed=seeds,
)
def test_attend_without_query_features_reads_no_linear_state_and_writes_the_same(sizes, length, pad, offset, seed):
    """``fq=None`` (what a ``softmax_only`` layer passes): the same exact partials and the same
    state as with the features, and a zero linear partial; uniform and padded rows, and rows that
    start at different positions."""
    attn = _drawn_layer(lola.LoLAConfig(**sizes, mixing="lolcats"), seed)
    q, k, v = _inputs(2, length + offset, 4, 2, 8, seed)
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    valid = torch.ones(2, length + offset, dtype=torch.bool)
    valid[0, : min(pad, length - 1)] = False
    states = []
    for features in (True, False):
        state = attn.new_state()
        state.allocate(2, 4, 2, 8, attn.feature_dim, k.dtype, k.device)
        if offset:  # row 1 first takes `offset` tokens alone: the rows then sit at different positions
            first = torch.zeros(2, offset, dtype=torch.bool)
            first[1] = True
            state.attend(qh[:, :, :offset], attn.feature_map_q(qh[:, :, :offset]), kh[:, :, :offset], vh[:, :, :offset], first, attn.scale, attn.feature_map_k)
        s = slice(offset, None)
        fq = attn.feature_map_q(qh[:, :, s]) if features else None
        exact, linear = state.attend(qh[:, :, s], fq, kh[:, :, s], vh[:, :, s], valid[:, s], attn.scale, attn.feature_map_k)
        states.append((exact, linear, state.state_dict()))
    (e1, l1, s1), (e2, l2, s2) = states
    for a, b in zip((e1.num, e1.den, e1.max), (e2.num, e2.den, e2.max)):
        torch.testing.assert_close(a, b)
    assert l2.num.shape == l1.num.shape and l2.den.shape == l1.den.shape
    assert not l2.num.any() and not l2.den.any()
    assert l1.den.any() or not s1["linear.s"].any()  # with features the linear state is read
    for key in s1:
        torch.testing.assert_close(s1[key], s2[key], msg=key)


@settings(max_examples=20, deadline=None)
@given(
    sizes=memory_sizes(window=(1, 4), sparse=(0, 4), sinks=(0, 2), chunk=(1, 5)),
    mixing=st.sampled_from(["lolcats", "softmax_only"]),
    lead=st.integers(1, 6),
    seed=seeds,
)
def test_one_token_per_row_at_different_positions_equals_each_row_alone(sizes, mixing, lead, seed):
    """Single tokens of rows at different positions run as the loop's host case (each row's step
    before its read, no device read): outputs and states equal each row's run in a batch of its own."""
    attn = _drawn_layer(lola.LoLAConfig(**sizes, mixing=mixing), seed)
    q, k, v = _inputs(2, lead + 2 * sizes["chunk"] + 3, 4, 2, 8, seed)
    mask = torch.ones(2, lead + 1, dtype=torch.bool)
    mask[0, :lead] = False  # row 0 starts `lead` tokens behind row 1
    _, both = attn(q[:, : lead + 1], k[:, : lead + 1], v[:, : lead + 1], padding_mask=mask)
    alone = []
    for row in range(2):
        start = lead if row == 0 else 0
        _, st_ = attn(q[row : row + 1, start : lead + 1], k[row : row + 1, start : lead + 1], v[row : row + 1, start : lead + 1])
        alone.append(st_)
    for i in range(lead + 1, q.shape[1]):
        qi, ki, vi = q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1]
        with K.record_calls():
            o, _ = attn(qi, ki, vi, state=both)
        for row in range(2):
            o_row, _ = attn(qi[row : row + 1], ki[row : row + 1], vi[row : row + 1], state=alone[row])
            torch.testing.assert_close(o[row : row + 1], o_row, rtol=1e-5, atol=1e-5)
    for row in range(2):
        mine = _slots_in_position_order(alone[row].state_dict())
        for key, t in _slots_in_position_order(both.state_dict()).items():
            torch.testing.assert_close(t[row : row + 1], mine[key], msg=key)


def _slots_in_position_order(state: dict) -> dict:
    """The state with the sparse cache's slots sorted by position and empty slots zeroed (the
    cache holds no order, and an empty slot's contents are not part of the state's meaning)."""
    out = dict(state)
    pos = state["sparse.pos"]
    order = pos.argsort(dim=-1, stable=True)
    held = pos.gather(-1, order) >= 0
    out["sparse.pos"] = pos.gather(-1, order)
    for name in ("sparse.k", "sparse.v"):
        t = state[name].gather(2, order.unsqueeze(-1).expand_as(state[name]))
        out[name] = torch.where(held.unsqueeze(-1), t, 0.0)
    return out
