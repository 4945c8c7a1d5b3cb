"""Bounded positions: the rotation they re-rotate with, and the layer that reads with them.

The references rotate raw vectors at explicitly assigned positions in float64 (tests/oracles.py
``rope``), independently of :class:`lola.RotaryEmbedding`.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola
from lola.core.positions import BoundedPositions, RotaryEmbedding
from tests.oracles import assert_rel_close, hybrid_exact_mask, lolcats_hybrid, repeat_kv, rope
from tests.strategies import seeds


def rotary(d: int, theta: float = 100.0) -> RotaryEmbedding:
    return RotaryEmbedding.from_theta(theta, d)


# The rotation ------------------------------------------------------------------------------------
@settings(max_examples=30)
@given(d=st.sampled_from([2, 4, 8, 16]), a=st.integers(-5000, 5000), b=st.integers(-5000, 5000), seed=seeds)
def test_rotations_compose_and_match_rope_at_explicit_positions(d, a, b, seed):
    rot = rotary(d)
    x = torch.randn(3, 5, d, generator=torch.Generator().manual_seed(seed))
    pa, pb = torch.full((3, 5), a), torch.full((3, 5), b)
    assert_rel_close(rope(x, pa + pb, rot.inv_freq), rot.rotate(rot.rotate(x, pa), pb), 1e-5)
    assert_rel_close(rope(x, pa, rot.inv_freq), rot.rotate(x, pa), 1e-6)


def test_a_zero_delta_returns_the_same_values_exactly_in_every_dtype():
    rot = rotary(8)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(2, 3, 7, 8).to(dtype)
        assert torch.equal(rot.rotate(x, torch.zeros(2, 3, 7, dtype=torch.long)), x)


def test_partial_rotary_leaves_the_other_dimensions():
    rot = RotaryEmbedding(torch.tensor([1.0, 0.1]))  # rotates 4 of 6 dimensions
    x = torch.randn(2, 6)
    y = rot.rotate(x, torch.tensor([3, 7]))
    assert torch.equal(y[:, 4:], x[:, 4:])
    assert_rel_close(rope(x[:, :4], torch.tensor([3, 7]), rot.inv_freq), y[:, :4], 1e-6)


def test_from_model_matches_the_models_own_rope():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=1, intermediate_size=32, vocab_size=11, rope_theta=500.0)
    model = transformers.LlamaForCausalLM(cfg)
    rot = RotaryEmbedding.from_model(model)
    x = torch.randn(1, 4, 9, 16)
    pos = torch.arange(100, 109)[None]
    cos, sin = model.model.rotary_emb(x, pos)
    ref, _ = apply_rotary_pos_emb(x, x, cos, sin)
    assert_rel_close(ref, rot.rotate(x, pos[:, None, :].expand(1, 4, 9)), 1e-5)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: RotaryEmbedding(torch.ones(2, 2)), "1-D"),
        (lambda: RotaryEmbedding(torch.tensor([float("nan")])), "finite"),
        (lambda: RotaryEmbedding.from_theta(0.5, 8), "theta"),
        (lambda: RotaryEmbedding.from_theta(100.0, 7), "even"),
        (lambda: BoundedPositions(rotary(8), 0, 4), "exact_distance"),
        (lambda: BoundedPositions(rotary(8), 4, True), "state_positions"),
        (lambda: BoundedPositions("rope", 4, 4), "RotaryEmbedding"),
    ],
)
def test_bad_arguments_are_named(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


# The layer ---------------------------------------------------------------------------------------
def bounded_logits(q_raw, k_raw, rot, scale, distance, chunk):
    """``[B, H, T, T]`` float64 logits: query ``i`` at ``i``, key ``j`` at ``max(j, g(i) − distance)``,
    ``g(i)`` the first position of ``i``'s schedule period (steps after ``C − 1, 2C − 1, …``)."""
    t = q_raw.shape[1]
    i = torch.arange(t)
    g = (((i + 1) // chunk) * chunk - 1).clamp_min(0)
    e = torch.maximum(i[None, :], (g - distance)[:, None])  # [T_q, T_k]
    qi = rope(q_raw, i[None, :, None].expand(q_raw.shape[:3]), rot.inv_freq)  # [B, T, H, D]
    out = torch.empty(q_raw.shape[0], q_raw.shape[2], t, t, dtype=torch.float64)
    for a in range(t):
        kj = rope(k_raw, e[a][None, :, None].expand(k_raw.shape[:3]), rot.inv_freq)
        out[:, :, a, :] = torch.einsum("bhd,bjhd->bhj", qi[:, a], kj) * scale
    return out


def absolute_inputs(q_raw, k_raw, rot):
    """The model's view: raw vectors rotated at their positions ``0 … T−1`` (float32)."""
    t = q_raw.shape[1]
    at = lambda x: rot.rotate(x, torch.arange(t)[None, :, None].expand(x.shape[:3]))  # noqa: E731
    return at(q_raw), at(k_raw)


@settings(max_examples=40, deadline=None)
@given(
    t=st.integers(1, 48),
    heads=st.sampled_from([(2, 1), (2, 2), (4, 2)]),
    window=st.integers(0, 10),
    sinks=st.integers(0, 3),
    chunk=st.integers(1, 8),
    beyond=st.integers(0, 16),
    state_positions=st.integers(1, 40),
    key_positions=st.sampled_from(["clamped", "spread"]),
    seed=seeds,
)
def test_bounded_reads_equal_a_reference_at_explicit_positions(t, heads, window, sinks, chunk, beyond, state_positions, key_positions, seed):
    """No sparse cache: the sliding-window + linear hybrid (invariant 3), its exact keys at the
    positions the bounds assign and its features at positions below ``state_positions`` (the
    state's keys past it at ``state_positions − 1``, or spread: at ``j mod (state_positions −
    window)``)."""
    h, h_kv = heads
    d = 8
    distance = max(1, window + beyond)  # at least the window (its keys keep their distances)
    if key_positions == "spread":
        state_positions = max(state_positions, window + 1)
    rot = rotary(d)
    cfg = lola.LoLAConfig(
        window=window, sparse_size=0, sinks=sinks, chunk=chunk, mixing="lolcats", feature_map="hedgehog",
        positions="bounded", exact_distance=distance, state_positions=state_positions, state_key_positions=key_positions,
    )  # fmt: skip
    torch.manual_seed(seed)
    attn = lola.compose(cfg, num_heads=h, head_dim=d, num_kv_heads=h_kv, rotary=rot)
    with torch.no_grad():
        attn.window_factors.uniform_(-2.0, 2.0)
    g = torch.Generator().manual_seed(seed)
    q_raw, k_raw, v = torch.randn(1, t, h, d, generator=g), torch.randn(1, t, h_kv, d, generator=g), torch.randn(1, t, h_kv, d, generator=g)
    q, k = absolute_inputs(q_raw, k_raw, rot)
    with torch.no_grad():
        o, _ = attn(q, k, v)
        group = h // h_kv
        k_raw_h, v_h = repeat_kv(k_raw, group), repeat_kv(v, group)
        clamp = torch.arange(t).clamp_max(state_positions - 1)[None, :, None]
        j = torch.arange(t)
        at_k = clamp if key_positions == "clamped" else torch.where(j >= state_positions, j % (state_positions - window), j)[None, :, None]
        fq = attn.feature_map_q(rope(q_raw, clamp.expand(1, t, h), rot.inv_freq).float().transpose(1, 2)).transpose(1, 2)
        fk = attn.feature_map_k(rope(k_raw_h, at_k.expand(1, t, h), rot.inv_freq).float().transpose(1, 2)).transpose(1, 2)
        logits = bounded_logits(q_raw, k_raw_h, rot, attn.scale, distance, chunk)
        mask = hybrid_exact_mask(t, window, sinks, chunk)
        gate = torch.sigmoid(attn.window_factors.view(-1))
        ref = lolcats_hybrid(q, k_raw_h, v_h, fq, fk, mask, gate, attn.scale, logits=logits)
    assert_rel_close(ref, o, 1e-5)


def evicting_layer(positions: str, seed: int, budgets: list[int] | None, policy: str, distance: int = 12, state_positions: int = 20, keys: str = "clamped"):
    bounded = dict(positions="bounded", exact_distance=distance, state_positions=state_positions, state_key_positions=keys) if positions == "bounded" else {}
    cfg = lola.LoLAConfig(
        window=4, sparse_size=3, sinks=1, chunk=4, policy=policy, mixing="lola_authors", feature_map="hedgehog",
        sparse_size_per_head=budgets, **bounded,
    )  # fmt: skip
    torch.manual_seed(seed)
    attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2, rotary=rotary(8) if bounded else None)
    with torch.no_grad():
        attn.window_factors.uniform_(-2.0, 2.0)
    return attn


@settings(max_examples=25, deadline=None)
@given(
    t=st.integers(1, 60),
    budgets=st.sampled_from([None, [5, 1], [0, 6]]),
    policy=st.sampled_from(["sre", "recency", "key_norm", "attention", "expected_attention", "key_diff"]),
    cut=st.data(),
    keys=st.sampled_from(["clamped", "spread"]),
    seed=seeds,
)
def test_bounded_layer_splits_and_resumes_as_one_call(t, budgets, policy, cut, keys, seed):
    """Invariant 5 with positions that move: any partition into calls (prefill, then tokens one
    by one through the fused decode step) gives the outputs of one call; ragged budgets too."""
    attn = evicting_layer("bounded", seed, budgets, policy, keys=keys)
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(2, t, 4, 8, generator=g), torch.randn(2, t, 2, 8, generator=g), torch.randn(2, t, 2, 8, generator=g)
    with torch.no_grad():
        whole, _ = attn(q, k, v)
        first = cut.draw(st.integers(1, t))
        head, state = attn(q[:, :first], k[:, :first], v[:, :first])
        parts = [head]
        for i in range(first, t):
            o, state = attn(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)
            parts.append(o)
    assert_rel_close(whole, torch.cat(parts, dim=1), 1e-5)


@settings(max_examples=25, deadline=None)
@given(
    t=st.integers(1, 11),
    budgets=st.sampled_from([None, [5, 1]]),
    policy=st.sampled_from(["sre", "recency", "attention"]),
    padded=st.booleans(),
    keys=st.sampled_from(["clamped", "spread"]),
    seed=seeds,
)
def test_a_stream_inside_both_limits_reads_as_with_absolute_positions(t, budgets, policy, padded, keys, seed):
    """Positions that do not move: a stream shorter than ``exact_distance`` and
    ``state_positions`` gives today's outputs and state, bit for bit."""
    bounded, absolute = evicting_layer("bounded", seed, budgets, policy, keys=keys), evicting_layer("absolute", seed, budgets, policy)
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(2, t, 4, 8, generator=g), torch.randn(2, t, 2, 8, generator=g), torch.randn(2, t, 2, 8, generator=g)
    mask = torch.ones(2, t, dtype=torch.bool)
    if padded and t > 1:
        mask[1, : t // 2] = False
    with torch.no_grad():
        ob, sb = bounded(q, k, v, padding_mask=mask)
        oa, sa = absolute(q, k, v, padding_mask=mask)
    assert torch.equal(ob, oa)
    for name, x in sa.state_dict().items():
        assert torch.equal(x, sb.state_dict()[name]), name


def one_stream(*layers: lola.LoLAAttention) -> list[tuple[torch.Tensor, object]]:
    """Each layer's ``(output, state)`` on the same 40 random tokens."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 40, 4, 8, generator=g), torch.randn(1, 40, 2, 8, generator=g), torch.randn(1, 40, 2, 8, generator=g)
    with torch.no_grad():
        return [layer(q, k, v) for layer in layers]


def test_far_keys_move_and_change_the_output():
    """Past the limits the bounds change the reads (the property tests above are not vacuous)."""
    (ob, _), (oa, _) = one_stream(evicting_layer("bounded", 0, None, "sre", distance=6, state_positions=8), evicting_layer("absolute", 0, None, "sre"))
    assert torch.equal(ob[:, :6], oa[:, :6])
    assert not torch.allclose(ob[:, 20:], oa[:, 20:], atol=1e-4)


def test_spread_state_keys_change_the_state_past_its_limit_only():
    """The state's keys spread (not clamped) once the stream passes ``state_positions``: the
    same outputs before it, another linear state after it."""
    clamped = evicting_layer("bounded", 0, None, "sre", distance=6, state_positions=8)
    spread = evicting_layer("bounded", 0, None, "sre", distance=6, state_positions=8, keys="spread")
    (oc, sc), (os_, ss) = one_stream(clamped, spread)
    assert torch.equal(oc[:, :8], os_[:, :8])
    assert not torch.allclose(sc.linear.state[0], ss.linear.state[0], atol=1e-4)
    assert not torch.equal(oc[:, 24:], os_[:, 24:])  # (the paper's rule gives the state a small share here)


@settings(max_examples=30)
@given(s=st.integers(2, 300), spread=st.data(), n=st.integers(1, 40), seed=seeds)
def test_state_keys_spread_to_their_position_modulo_the_range(s, spread, n, seed):
    """``state_keys`` with ``key_spread W``: a key at ``p >= S`` reads as the raw key rotated
    at ``p mod (S − W)``, one below ``S`` and an empty slot (``-1``) as they are."""
    w = spread.draw(st.integers(0, s - 1))
    bounded = BoundedPositions(rotary(8), exact_distance=s, state_positions=s, key_spread=w)
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(1, 2, n, 8, generator=g)
    pos = torch.randint(-1, 4 * s, (1, 2, n), generator=g)
    k = rotary(8).rotate(raw, pos.clamp_min(0))
    target = torch.where(pos >= s, pos % (s - w), pos.clamp_min(0))
    expected = rope(raw.transpose(1, 2), target.transpose(1, 2), rotary(8).inv_freq).transpose(1, 2)
    got = bounded.state_keys(k, pos)
    assert_rel_close(expected, got, 1e-5)
    assert torch.equal(got[pos < 0], k[pos < 0])


# Refusals ----------------------------------------------------------------------------------------
def test_limits_without_bounded_positions_are_refused():
    with pytest.raises(ValueError, match="exact_distance bound the positions of reads only with positions='bounded'"):
        lola.LoLAConfig(exact_distance=100)
    with pytest.raises(ValueError, match="state_positions"):
        lola.LoLAConfig(state_positions=100)
    with pytest.raises(ValueError, match="state_key_positions bound the positions of reads only with positions='bounded'"):
        lola.LoLAConfig(state_key_positions="spread")
    with pytest.raises(ValueError, match=r"state_key_positions='spread' places the state's keys .* give state_positions above the window"):
        lola.LoLAConfig(positions="bounded", window=16, state_positions=16, state_key_positions="spread")
    with pytest.raises(ValueError, match=r"key_spread must be None or an int in \[0, state_positions=8\)"):
        BoundedPositions(rotary(8), exact_distance=8, state_positions=8, key_spread=8)


def test_spread_keys_filled_in_limits_are_checked_when_the_layer_is_built():
    """``state_positions`` filled in after validation (``resolve_positions`` copies the config):
    a spread no longer above the window is refused where the layer's positions are built."""
    from lola.layer import bounded_positions

    cfg = lola.LoLAConfig(positions="bounded", window=16, state_key_positions="spread")
    with pytest.raises(ValueError, match=r"distances from the window \(16\) to state_positions \(16\)"):
        bounded_positions(cfg.model_copy(update={"state_positions": 16, "exact_distance": 32}), rotary(8))
    assert bounded_positions(cfg.model_copy(update={"state_positions": 64, "exact_distance": 64}), rotary(8)).key_spread == 16


def test_limits_are_model_wide_and_the_window_keeps_its_distances():
    with pytest.raises(ValueError, match=r"cannot override \['positions'\]"):
        lola.LoLAConfig(positions="bounded", layer_overrides={0: {"positions": "absolute"}})
    with pytest.raises(ValueError, match="exact_distance=10 is shorter than the window"):
        lola.LoLAConfig(positions="bounded", window=16, exact_distance=10)


def test_bounded_positions_need_a_rotation_and_limits():
    cfg = lola.LoLAConfig(window=8, positions="bounded", exact_distance=10, state_positions=10)
    with pytest.raises(ValueError, match=r"needs rotary= \(the model's RotaryEmbedding\)"):
        lola.compose(cfg, num_heads=2, head_dim=8)
    with pytest.raises(ValueError, match="cfg.state_positions"):
        lola.compose(lola.LoLAConfig(window=8, positions="bounded", exact_distance=10), num_heads=2, head_dim=8, rotary=rotary(8))
    with pytest.raises(ValueError, match="rotates 16 dimensions, heads have 8"):
        lola.compose(cfg, num_heads=2, head_dim=8, rotary=rotary(16))


def test_a_schedule_off_the_period_grid_is_refused():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Shifted:
        period: int = 4

        def tokens_until_step(self, seen):
            return self.period - (seen + 1) % self.period

    memory = lambda: lola.LoLAMemory(  # noqa: E731
        window=lola.memory.SlidingWindow(4, max_pending=4), sparse=lola.memory.SparseCache(2), policy=lola.policies.build("recency"), schedule=Shifted()
    )
    fmap = lola.feature_maps.build_feature_map("elu", 2, 8, 4)
    with pytest.raises(ValueError, match="steps after positions P-1, 2P-1"):
        lola.LoLAAttention(2, 8, memory_factory=memory, feature_map_q=fmap, feature_map_k=fmap, positions=BoundedPositions(rotary(8), 8, 8))


@settings(max_examples=15, deadline=None)
@given(t=st.integers(22, 40), cut=st.data(), seed=seeds)
def test_a_decoded_token_reads_the_run_as_it_is_after_rows_are_reordered_mid_period(t, cut, seed):
    """Decoded tokens past ``exact_distance`` read the ragged run through a view rotated once
    per schedule period; rows reordered within a period (beam search) are read as they now are:
    the outputs equal those of the rows decoded in the new order from the start."""
    attn = evicting_layer("bounded", seed, [5, 1], "sre", distance=12)
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(2, t, 4, 8, generator=g), torch.randn(2, t, 2, 8, generator=g), torch.randn(2, t, 2, 8, generator=g)
    first = cut.draw(st.integers(14, t - 4))
    swap = cut.draw(st.integers(first + 1, t - 2))  # a token after which the rows swap
    flip = torch.tensor([1, 0])
    with torch.no_grad():
        _, state = attn(q[:, :first], k[:, :first], v[:, :first])
        _, want_state = attn(q[flip, :first], k[flip, :first], v[flip, :first])
        for i in range(first, t):
            if i == swap:
                state.select_rows(flip)
            rows = flip if i >= swap else torch.arange(2)
            o, state = attn(q[rows, i : i + 1], k[rows, i : i + 1], v[rows, i : i + 1], state=state)
            want, want_state = attn(q[flip, i : i + 1], k[flip, i : i + 1], v[flip, i : i + 1], state=want_state)
            if i >= swap:
                assert_rel_close(want, o, 1e-5)
