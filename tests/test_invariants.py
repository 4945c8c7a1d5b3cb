"""The eight invariants of the architecture, as hypothesis property tests.

Each test draws batch, heads, K/V heads, head size, length, window, sparse size, sinks, chunk
and split points, and compares lola against an independent oracle (tests/oracles.py) or
against itself under a different evaluation order.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola
from tests.oracles import (
    assert_rel_close,
    causal_softmax,
    hybrid_exact_mask,
    lolcats_hybrid,
    recurrent_linear_attention,
    repeat_kv,
    step_decay_weights,
)
from tests.strategies import memory_sizes, seeds, storages

POLICIES = ["sre", "attention", "recency", "random", "key_norm", "expected_attention", "key_diff", "fusion", "span", "at_exit", "peak"]
FEATURE_MAPS = ["hedgehog_identity", "elu", "hedgehog", "taylor"]
feature_maps = st.sampled_from(FEATURE_MAPS)


@st.composite
def shapes(draw, max_t: int = 40):
    """``(b, t, h, h_kv, d)``: batch, length, query heads (a multiple of ``h_kv``), K/V heads, head size."""
    b = draw(st.integers(1, 3))
    h_kv = draw(st.integers(1, 2))
    h = h_kv * draw(st.integers(1, 3))
    d = draw(st.sampled_from([4, 6, 8]))
    t = draw(st.integers(1, max_t))
    return b, t, h, h_kv, d


def make_inputs(b, t, h, h_kv, d, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, h, d, generator=g).to(dtype)
    k = torch.randn(b, t, h_kv, d, generator=g).to(dtype)
    v = torch.randn(b, t, h_kv, d, generator=g).to(dtype)
    return q, k, v


def build(cfg: lola.LoLAConfig, h: int, h_kv: int, d: int, seed: int = 0) -> lola.LoLAAttention:
    torch.manual_seed(seed)  # trainable Hedgehog maps start random
    attn = lola.compose(cfg, num_heads=h, head_dim=d, num_kv_heads=h_kv)
    with torch.no_grad():  # draw distinct gates per head so mixing bugs show
        attn.window_factors.uniform_(-2.0, 2.0)
    return attn


def layer_and_inputs(cfg: lola.LoLAConfig, shape: tuple[int, int, int, int, int], seed: int):
    """``build``'s layer for ``cfg`` and its inputs ``q [b, t, h, d]``, ``k, v [b, t, h_kv, d]``
    for ``shape = (b, t, h, h_kv, d)``, all from ``seed``."""
    b, t, h, h_kv, d = shape
    return build(cfg, h, h_kv, d, seed), *make_inputs(b, t, h, h_kv, d, seed)


def run_split(attn, q, k, v, cuts, padding_mask=None):
    """Run the segments between sorted ``cuts``, passing the state along."""
    state, outs = None, []
    bounds = [0, *cuts, q.shape[1]]
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b <= a:
            continue
        pm = None if padding_mask is None else padding_mask[:, a:b]
        o, state = attn(q[:, a:b], k[:, a:b], v[:, a:b], state=state, padding_mask=pm)
        outs.append(o)
    return torch.cat(outs, dim=1), state


def key_features(attn, k):
    """φ_k of raw keys per query head: ``k [B, T, H_kv, D]`` → ``[B, T, H, F]``."""
    g = attn.num_heads // attn.num_kv_heads
    return attn.feature_map_k(repeat_kv(k, g).transpose(1, 2)).transpose(1, 2)


def assert_states_equal(a: lola.LoLAMemory, b: lola.LoLAMemory, ratio: float = 1e-5) -> None:
    """Every tensor of two states agrees: positions exactly, each held token's key, value and
    tally matched by position (slot order inside a memory is free), the linear state and the
    query statistics to ``ratio``."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    compared = set()
    for block in sorted(name.removesuffix(".pos") for name in sa if name.endswith(".pos")):
        order_a, order_b = sa[f"{block}.pos"].sort(-1), sb[f"{block}.pos"].sort(-1)  # [B, Hs, N]
        assert torch.equal(order_a.values, order_b.values), f"{block}.pos"
        held = order_a.values >= 0
        compared.add(f"{block}.pos")
        for field in ("k", "v", "acc"):
            name = f"{block}.{field}"
            if name not in sa:
                continue
            xa, xb = sa[name], sb[name]
            ia, ib = order_a.indices, order_b.indices
            if xa.dim() == 4:  # k, v: [B, Hs, N, D]
                ia, ib = (i.unsqueeze(-1).expand(*i.shape, xa.shape[-1]) for i in (ia, ib))
            ga, gb = xa.gather(2, ia), xb.gather(2, ib)
            mask = held if xa.dim() == 3 else held.unsqueeze(-1).expand_as(ga)
            assert_rel_close(ga[mask].double(), gb[mask].double(), ratio, name)
            compared.add(name)
    for name in sa.keys() - compared:
        if name == "seen":
            assert torch.equal(sa[name], sb[name])
        else:
            assert_rel_close(sa[name], sb[name], ratio, name)


def readable(sizes: dict[str, int]) -> dict:
    """The default rule reads exact tokens alone and is refused for a layer with none; such a
    draw reads the linear state (the invariants are the memories', whatever the rule)."""
    return {} if sizes["window"] + sizes["sparse_size"] + sizes["sinks"] else {"mixing": "lola_authors"}


@st.composite
def evicting_configs(draw, sizes: st.SearchStrategy[dict[str, int]], policies: list[str] = POLICIES) -> dict:
    """``LoLAConfig`` keyword arguments: memory sizes drawn from ``sizes``, an eviction policy from
    ``policies`` and a GQA storage, with a mixing rule that a layer of those sizes may use."""
    config = draw(sizes) | {"policy": draw(st.sampled_from(policies)), "gqa_storage": draw(storages)}
    return config | readable(config)


# 1 -----------------------------------------------------------------------------------------------
@settings(max_examples=40)
@given(
    shape=shapes(),
    sizes=memory_sizes(window=(0, 12), sparse=0, sinks=(0, 3), chunk=(1, 8)),
    policy=st.sampled_from(POLICIES),
    mixing=st.sampled_from(["lolcats", "lola_authors", "softmax_only"]),
    storage=storages,
    fmap=feature_maps,
    seed=seeds,
)
def test_invariant1_nothing_evicted_is_exact_softmax(shape, sizes, policy, mixing, storage, fmap, seed):
    t = shape[1]
    sizes = sizes | {"sparse_size": max(0, t - sizes["window"] - sizes["sinks"])}  # window + sparse + sinks >= T: nothing reaches H
    cfg = lola.LoLAConfig(**sizes, policy=policy, mixing=mixing, gqa_storage=storage, feature_map=fmap)
    attn, q, k, v = layer_and_inputs(cfg, shape, seed)
    o, state = attn(q, k, v)
    assert_rel_close(causal_softmax(q, k, v, attn.scale), o, 1e-5, "one call")
    assert float(state.linear.s.detach().abs().sum()) == 0.0
    o_tok, _ = run_split(attn, q, k, v, list(range(1, t)))
    assert_rel_close(causal_softmax(q, k, v, attn.scale), o_tok, 1e-5, "token by token")


# 2 -----------------------------------------------------------------------------------------------
@settings(max_examples=30)
@given(
    shape=shapes(),
    mixing=st.sampled_from(["lolcats", "lola_authors"]),
    schedule=st.sampled_from(["tokenwise", "chunk1"]),
    fmap=feature_maps,
    seed=seeds,
)
def test_invariant2_no_exact_memory_is_linear_attention(shape, mixing, schedule, fmap, seed):
    h, h_kv = shape[2:4]
    sched = dict(schedule="tokenwise") if schedule == "tokenwise" else dict(schedule="chunkwise", chunk=1)
    cfg = lola.LoLAConfig(window=0, sparse_size=0, sinks=0, mixing=mixing, feature_map=fmap, **sched)
    attn, q, k, v = layer_and_inputs(cfg, shape, seed)
    with torch.no_grad():
        o, _ = attn(q, k, v)
        fq = attn.feature_map_q(q.transpose(1, 2)).transpose(1, 2)
        ref = recurrent_linear_attention(fq, key_features(attn, k), repeat_kv(v, h // h_kv))
    assert_rel_close(ref, o, 1e-5)


# 3 -----------------------------------------------------------------------------------------------
@settings(max_examples=40)
@given(
    shape=shapes(),
    sizes=memory_sizes(window=(0, 10), sparse=0, sinks=(0, 3), chunk=(1, 8)),
    affine=st.booleans(),
    storage=storages,
    fmap=feature_maps,
    decay=st.sampled_from([1.0, 0.9, 0.5]),
    cap=st.sampled_from([None, 0.3, 0.8]),
    cap_from=st.sampled_from([0, 3, 7]),
    seed=seeds,
)
def test_invariant3_no_sparse_cache_is_the_lolcats_hybrid(shape, sizes, affine, storage, fmap, decay, cap, cap_from, seed):
    t, h, h_kv = shape[1:4]
    cfg = lola.LoLAConfig(
        **sizes,
        mixing="lolcats",
        affine=affine,
        gqa_storage=storage,
        feature_map=fmap,
        linear_decay=decay,
        linear_share_cap=cap,
        linear_share_cap_from=cap_from if cap is not None else 0,
    )
    attn, q, k, v = layer_and_inputs(cfg, shape, seed)
    g = h // h_kv
    with torch.no_grad():
        fq = attn.feature_map_q(q.transpose(1, 2)).transpose(1, 2)
        gate = torch.sigmoid(attn.window_factors).view(-1)
        exact = hybrid_exact_mask(t, sizes["window"], sizes["sinks"], sizes["chunk"])
        weights = step_decay_weights(t, sizes["chunk"], decay)  # a decaying state: each key by its age at the last step
        ref = lolcats_hybrid(q, repeat_kv(k, g), repeat_kv(v, g), fq, key_features(attn, k), exact, gate, attn.scale, affine, weights, cap, cap_from)
        o_par, _ = attn(q, k, v)
        o_rec, _ = run_split(attn, q, k, v, list(range(1, t)))
    assert_rel_close(ref, o_par, 1e-5, "chunk-parallel")
    assert_rel_close(ref, o_rec, 1e-5, "token-recurrent")


# 4 -----------------------------------------------------------------------------------------------
@settings(max_examples=25)
@given(shape=shapes(), sizes=memory_sizes(window=(0, 8), sparse=(0, 8), sinks=(0, 2)), policy=st.sampled_from(POLICIES), seed=seeds)
def test_invariant4_chunkwise_one_equals_tokenwise(shape, sizes, policy, seed):
    b, t, h, h_kv, d = shape
    common = dict(**sizes, policy=policy, **readable(sizes))
    a1 = build(lola.LoLAConfig(schedule="tokenwise", **common), h, h_kv, d, seed)
    a2 = build(lola.LoLAConfig(schedule="chunkwise", chunk=1, **common), h, h_kv, d, seed)
    a2.load_state_dict(a1.state_dict())
    q, k, v = make_inputs(b, t, h, h_kv, d, seed)
    with torch.no_grad():
        o1, s1 = a1(q, k, v)
        o2, s2 = a2(q, k, v)
    assert_rel_close(o1, o2, 1e-6)
    assert_states_equal(s1, s2, 1e-6)


@settings(max_examples=25)
@given(shape=shapes(), sizes=memory_sizes(window=(0, 8), sparse=(0, 8), sinks=(0, 2)), schedule=st.sampled_from(["tokenwise", "chunk1"]), seed=seeds)
def test_invariant4_a_step_after_every_token_keeps_the_newest_tokens_exact_under_fifo(shape, sizes, schedule, seed):
    # An oracle outside the engine: stepping after every token with the FIFO policy, the sparse
    # cache holds the λ tokens that left the window last, so query p reads exactly its sinks and
    # its newest W + λ tokens, and every older one through the state: the LoLCATs hybrid with a
    # window of W + λ. (Chunkwise(1) and Tokenwise running the same engine code cannot show a
    # wrong step timing; this can.)
    b, t, h, h_kv, d = shape
    sched = dict(schedule="tokenwise") if schedule == "tokenwise" else dict(schedule="chunkwise", chunk=1)
    cfg = lola.LoLAConfig(**sizes, **sched, policy="recency", mixing="lolcats")
    attn, q, k, v = layer_and_inputs(cfg, shape, seed)
    g = h // h_kv
    with torch.no_grad():
        fq = attn.feature_map_q(q.transpose(1, 2)).transpose(1, 2)
        gate = torch.sigmoid(attn.window_factors).view(-1)
        exact = hybrid_exact_mask(t, sizes["window"] + sizes["sparse_size"], sizes["sinks"], 1)
        ref = lolcats_hybrid(q, repeat_kv(k, g), repeat_kv(v, g), fq, key_features(attn, k), exact, gate, attn.scale)
        o, _ = attn(q, k, v)
    assert_rel_close(ref, o, 1e-5)


# 5 -----------------------------------------------------------------------------------------------
@settings(max_examples=40)
@given(
    shape=shapes(),
    config=evicting_configs(memory_sizes(window=(0, 10), sparse=(0, 10), sinks=(0, 3), chunk=(1, 8))),
    decay=st.sampled_from([1.0, 0.8]),
    data=st.data(),
)
def test_invariant5_split_and_resume(shape, config, decay, data):
    t = shape[1]
    seed = data.draw(seeds)
    attn, q, k, v = layer_and_inputs(lola.LoLAConfig(**config, linear_decay=decay), shape, seed)
    # A prefill of any length, then decode token by token, then maybe another segment.
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, t - 1)), max_size=6))))
    if data.draw(st.booleans()):
        first = cuts[0] if cuts else t
        cuts = sorted(set(cuts) | set(range(first, min(t, first + 6))))
    with torch.no_grad():
        o_one, s_one = attn(q, k, v)
        o_split, s_split = run_split(attn, q, k, v, cuts)
    assert_rel_close(o_one, o_split, 1e-5)
    assert_states_equal(s_one, s_split)


# 6 -----------------------------------------------------------------------------------------------
def positions(block_pos: torch.Tensor, b: int, hs: int) -> list[int]:
    return [int(p) for p in block_pos[b, hs] if p >= 0]


@settings(max_examples=30)
@given(shape=shapes(), config=evicting_configs(memory_sizes(window=(0, 8), sparse=(0, 8), sinks=(0, 3), chunk=(1, 6))), seed=seeds)
def test_invariant6_conservation_every_token_in_exactly_one_memory(shape, config, seed):
    b, t, h, h_kv, d = shape
    sinks = config["sinks"]
    attn, q, k, v = layer_and_inputs(lola.LoLAConfig(**config), shape, seed)
    g = h // h_kv
    fk = key_features(attn, k).double()  # [B, T, H, F]
    vq = repeat_kv(v, g).double()
    state = None
    with torch.no_grad():
        for i in range(t):  # check after every step
            _, state = attn(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)
            hs_count = state.window.block.pos.shape[1]
            for row in range(b):
                for hs in range(hs_count):
                    places = [positions(m.block.pos, row, hs) for m in state.exact_memories]
                    flat = [p for pl in places for p in pl]
                    assert len(flat) == len(set(flat)), f"a token is in two exact memories: {places}"
                    assert set(flat) <= set(range(i + 1))
                    assert all(p < sinks for p in places[0]) and len(places[0]) == min(sinks, i + 1)
                    linear_set = sorted(set(range(i + 1)) - set(flat))
                    for qh in range(hs * (h // hs_count), (hs + 1) * (h // hs_count)):
                        Href = sum((fk[row, j, qh, :, None] * vq[row, j, qh, None, :] for j in linear_set), torch.zeros(fk.shape[-1], d, dtype=torch.float64))
                        sref = sum((fk[row, j, qh] for j in linear_set), torch.zeros(fk.shape[-1], dtype=torch.float64))
                        assert torch.allclose(state.linear.H[row, qh].double(), Href, rtol=1e-5, atol=1e-5)
                        assert torch.allclose(state.linear.s[row, qh].double(), sref, rtol=1e-5, atol=1e-5)


# 7 -----------------------------------------------------------------------------------------------
def oracle_scores(policy: str, attn, k, v, pos: list[int], row: int, hs: int, H: torch.Tensor, s: torch.Tensor, n_storage: int) -> list[float]:
    """Scores of candidate positions recomputed from the raw inputs (higher = keep)."""
    g_kv = attn.num_heads // attn.num_kv_heads
    kv_head = hs if n_storage == attn.num_kv_heads else hs // g_kv
    if policy == "recency":
        return [float(p) for p in pos]
    if policy == "key_norm":
        return [float(k[row, p, kv_head].double().norm()) for p in pos]
    # SRE, averaged over the query heads served by storage head hs
    per = attn.num_heads // n_storage
    out = []
    for p in pos:
        errs = []
        for qh in range(hs * per, (hs + 1) * per):
            fk = attn.feature_map_k(k[row, p, kv_head].view(1, 1, 1, -1).expand(1, attn.num_heads, 1, -1))[0, qh, 0].double()
            vhat = (fk @ H[row, qh].double()) / (fk @ s[row, qh].double() + 1e-6)
            errs.append(float((v[row, p, kv_head].double() - vhat).norm()))
        out.append(sum(errs) / len(errs))
    return out


@settings(max_examples=30)
@given(
    shape=shapes(max_t=30),
    config=evicting_configs(memory_sizes(window=(0, 6), sparse=(1, 6), sinks=(0, 2), chunk=(1, 5)), policies=["sre", "recency", "key_norm"]),
    seed=seeds,
)
def test_invariant7_sparse_cache_holds_top_scored_candidates(shape, config, seed):
    b, t = shape[:2]
    window, sparse, sinks, chunk, policy = (config[name] for name in ("window", "sparse_size", "sinks", "chunk", "policy"))
    attn, q, k, v = layer_and_inputs(lola.LoLAConfig(**config), shape, seed)
    state = None
    with torch.no_grad():
        for i in range(t):
            before = None if state is None else {n: x.clone() for n, x in state.state_dict().items()}
            _, state = attn(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)
            if (i + 1) % chunk or before is None:
                continue  # no step ran at this token
            n_storage = state.sparse.block.pos.shape[1]
            for row in range(b):
                for hs in range(n_storage):
                    win = sorted(positions(before["window.pos"], row, hs) + ([i] if i >= sinks else []))
                    leaving = win[: max(0, len(win) - window)]
                    cands = leaving + positions(before["sparse.pos"], row, hs)
                    scores = dict(zip(cands, oracle_scores(policy, attn, k, v, cands, row, hs, before["linear.H"], before["linear.s"], n_storage)))
                    kept = positions(state.sparse.block.pos, row, hs)
                    assert set(kept) <= set(cands) and len(kept) == min(sparse, len(cands))
                    evicted = set(cands) - set(kept)
                    if kept and evicted:
                        assert min(scores[p] for p in kept) >= max(scores[p] for p in evicted) - 1e-5 * (1 + abs(max(scores.values())))


# 8 -----------------------------------------------------------------------------------------------
@settings(max_examples=30)
@given(shape=shapes(), config=evicting_configs(memory_sizes(window=(0, 8), sparse=(0, 8), sinks=(0, 3), chunk=(1, 6))), data=st.data())
def test_invariant8_left_padded_batch_equals_each_row_alone(shape, config, data):
    b, t, h, h_kv, d = shape
    b = max(b, 2)
    seed = data.draw(seeds)
    attn, q, k, v = layer_and_inputs(lola.LoLAConfig(**config), (b, t, h, h_kv, d), seed)
    pads = data.draw(st.lists(st.integers(0, t - 1), min_size=b, max_size=b))
    mask = torch.ones(b, t, dtype=torch.bool)
    for row, p in enumerate(pads):
        mask[row, :p] = False
        for x in (q, k, v):  # garbage in the padding: it must not leak anywhere
            x[row, :p] = 1e3 * torch.randn_like(x[row, :p])
    decode = data.draw(st.integers(0, 4))
    qd, kd, vd = make_inputs(b, decode, h, h_kv, d, seed + 1)
    with torch.no_grad():
        o, state = attn(q, k, v, padding_mask=mask)
        od = [attn(qd[:, i : i + 1], kd[:, i : i + 1], vd[:, i : i + 1], state=state)[0] for i in range(decode)]
        for row, p in enumerate(pads):
            o_row, s_row = attn(q[row : row + 1, p:], k[row : row + 1, p:], v[row : row + 1, p:])
            assert_rel_close(o_row[0], o[row, p:], 1e-5, f"row {row}")
            assert torch.all(o[row, :p] == 0), "padded positions must output zeros"
            for i in range(decode):
                o1, s_row = attn(qd[row : row + 1, i : i + 1], kd[row : row + 1, i : i + 1], vd[row : row + 1, i : i + 1], state=s_row)
                assert_rel_close(o1[0], od[i][row], 1e-5, f"row {row} decode {i}")
            assert int(state.seen[row]) == t - p + decode


def test_the_state_comparison_sees_every_held_tokens_key_value_and_tally():
    # The comparison the invariants rest on: a state differing in one held token's key, value
    # or tally (and nothing else) must not pass as equal.
    import pytest

    attn = build(lola.LoLAConfig(window=3, sparse_size=2, sinks=1, chunk=2, policy="attention"), 2, 1, 4)
    q, k, v = make_inputs(1, 9, 2, 1, 4, 0)
    with torch.no_grad():
        _, reference = attn(q, k, v)
        for name in ("sparse.k", "window.v", "sinks.acc", "sparse.acc"):
            _, edited = attn(q, k, v)
            assert_states_equal(reference, edited)
            tensors = edited.state_dict()
            tensors[name][tensors[name.split(".")[0] + ".pos"] >= 0] += 0.5  # held slots only
            edited.load_state_dict(tensors)
            with pytest.raises(AssertionError, match=name):
                assert_states_equal(reference, edited)
