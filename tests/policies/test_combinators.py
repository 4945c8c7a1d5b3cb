import math
import types
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola
from lola.memory import KVBlock
from lola.policies import Distinct, Fusion, KeyNorm, PeakScore, Recency, ScoredAtExit, SpanPooling, ValueWeighted, zscore
from lola.policies.combinators import repeats, repeats_reference
from tests.policies.test_builtin import ctx_for
from tests.strategies import seeds


def cand_block(pos, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.tensor(pos)
    return KVBlock(torch.randn(*pos.shape, d, generator=g), torch.randn(*pos.shape, d, generator=g), pos)


def test_zscore_ignores_empty_slots():
    x = torch.tensor([[[1.0, 2.0, 3.0, 100.0]]])
    valid = torch.tensor([[[True, True, True, False]]])
    z = zscore(x, valid)
    sd = (2 / 3) ** 0.5
    torch.testing.assert_close(z, torch.tensor([[[-1 / sd, 0.0, 1 / sd, 0.0]]]))


@settings(max_examples=50, deadline=None)
# float32 values, as the scores are compared (two float64 values may round to one float32)
@given(a=st.floats(-1e6, 1e6, width=32), b=st.floats(-1e6, 1e6, width=32), empty=st.integers(0, 3))
def test_zscore_of_two_candidates_is_exactly_plus_and_minus_one(a, b, empty):
    # the formula gives ±1 up to rounding; two parts that disagree must then fuse to an exact
    # tie, not to noise that differs between a prefill in one call and the same tokens split
    x = torch.tensor([[[a, b] + [7.0] * empty]])
    valid = torch.tensor([[[True, True] + [False] * empty]])
    z = zscore(x, valid)[0, 0].tolist()
    expected = [0.0, 0.0] if a == b else ([1.0, -1.0] if a > b else [-1.0, 1.0])
    assert z == expected + [0.0] * empty
    assert (zscore(x, valid) + zscore(-x, valid)).abs().max() == 0  # opposite parts: an exact tie


def test_a_nan_score_of_two_candidates_stays_nan_for_the_step_to_refuse():
    x = torch.tensor([[[float("nan"), 3.0, 0.0], [1.0, float("nan"), 2.0]]])
    valid = torch.tensor([[[True, True, False], [True, True, True]]])
    z = zscore(x, valid)
    assert torch.isnan(z[0, 0, :2]).all() and torch.isnan(z[0, 1]).all()


def test_a_prefill_split_keeps_what_fusion_keeps_in_one_call():
    # a counterexample once found by test_invariant5: two candidates a step, the parts disagree
    from tests.oracles import assert_rel_close
    from tests.test_invariants import layer_and_inputs, run_split

    cfg = lola.LoLAConfig(window=0, sparse_size=1, sinks=2, chunk=2, policy="fusion", gqa_storage="kv_head")
    attn, q, k, v = layer_and_inputs(cfg, (1, 36, 4, 2, 6), 1)
    with torch.no_grad():
        assert_rel_close(attn(q, k, v)[0], run_split(attn, q, k, v, [1])[0], 1e-5)


def test_fusion_is_the_weighted_sum_of_standardised_scores():
    cand = cand_block([[[5, 1, 9, 3, -1]]])
    ctx, _ = ctx_for(h=1, d=2)
    fused = Fusion(policies=["recency", "key_norm"], weights=[2.0, -1.0]).score(cand, ctx)
    for j in range(4):
        rec = [5.0, 1.0, 9.0, 3.0]
        norms = [float(cand.k[0, 0, i].norm()) for i in range(4)]

        def z(xs, i):
            m = sum(xs) / 4
            sd = (sum((x - m) ** 2 for x in xs) / 4) ** 0.5
            return (xs[i] - m) / sd

        assert abs(float(fused[0, 0, j]) - (2 * z(rec, j) - z(norms, j))) < 1e-5
    with pytest.raises(ValueError, match="weights"):
        Fusion(policies=["sre"], weights=[1.0, 2.0])
    with pytest.raises(KeyError, match="unknown policy"):
        Fusion(policies=["nope"])


def test_fusion_asks_for_what_its_parts_need():
    assert Fusion(policies=["sre", "expected_attention"]).needs_queries
    assert not Fusion(policies=["sre", "recency"]).needs_queries
    assert Fusion(policies=["attention", "recency"]).needs_attention


def test_value_weighted_multiplies_by_the_value_norm():
    cand = cand_block([[[0, 1, 2]]])
    out = ValueWeighted(policy="key_norm").score(cand, None)
    torch.testing.assert_close(out, KeyNorm().score(cand, None) * cand.v.norm(dim=-1))


def test_span_pooling_takes_the_max_over_nearby_positions():
    pos = [[[10, 11, 12, 30, 13, -1], [10, 20, 21, 22, 40, 41]]]
    cand = cand_block(pos)
    inner = Recency().score(cand, None)
    out = SpanPooling(policy="recency", radius=1).score(cand, None)
    for h in range(2):
        for j, p in enumerate(pos[0][h]):
            if p < 0:
                continue
            near = [float(inner[0, h, i]) for i, q in enumerate(pos[0][h]) if q >= 0 and abs(q - p) <= 1]
            assert float(out[0, h, j]) == max(near)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), fresh=st.integers(0, 6), radius=st.integers(0, 3))
def test_span_pooling_among_the_cached_pools_over_the_cache_only(data, fresh, radius):
    """``among="cached"``: a candidate's score is the max of its own and those of the cached
    candidates (after ``ctx.fresh``) within ``radius`` positions; a token leaving the window
    lifts no neighbour, and outside a step (no ``ctx.fresh``) nothing is cached."""
    pos = data.draw(st.lists(st.lists(st.integers(-1, 12), min_size=6, max_size=6), min_size=2, max_size=2))
    cand = cand_block([pos])
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    inner = torch.randn(1, 2, 6, generator=g)

    class Fixed:
        def score(self, candidates, ctx):
            return inner

    policy = SpanPooling(policy="recency", radius=radius, among="cached")
    object.__setattr__(policy, "parts", (Fixed(),))
    out = policy.score(cand, types.SimpleNamespace(fresh=fresh))
    for h in range(2):
        for j, p in enumerate(pos[h]):
            if p < 0:
                assert float(out[0, h, j]) == float(inner[0, h, j])
                continue
            near = [float(inner[0, h, i]) for i, q in enumerate(pos[h]) if i >= fresh and q >= 0 and abs(q - p) <= radius]
            assert float(out[0, h, j]) == max([float(inner[0, h, j])] + near)
    assert torch.equal(policy.score(cand, types.SimpleNamespace(fresh=None)), inner)
    with pytest.raises(ValueError, match="among"):
        SpanPooling(among="window")


def test_span_pooling_across_heads_shares_spans():
    pos = [[[10, 50], [11, 60]]]
    cand = cand_block(pos)
    out = SpanPooling(policy="recency", radius=1, across_heads=True).score(cand, None)
    z = zscore(Recency().score(cand, None), cand.valid)
    # position 10 (head 0) sees 11 of head 1: both get the larger of their standardised scores
    assert float(out[0, 0, 0]) == pytest.approx(max(float(z[0, 0, 0]), float(z[0, 1, 0])))
    assert float(out[0, 1, 0]) == pytest.approx(max(float(z[0, 0, 0]), float(z[0, 1, 0])))
    assert float(out[0, 0, 1]) == pytest.approx(float(z[0, 0, 1]))


def test_combinators_are_configurable_by_name():
    cfg = lola.LoLAConfig(
        window=2, sparse_size=3, chunk=2, policy="span", policy_kwargs={"policy": "fusion", "policy_kwargs": {"policies": ["sre", "expected_attention"]}}
    )
    attn = lola.compose(cfg, num_heads=2, head_dim=4)
    o, state = attn(torch.randn(1, 12, 2, 4), torch.randn(1, 12, 2, 4), torch.randn(1, 12, 2, 4))
    assert torch.isfinite(o).all() and state.queries is not None


def repeats_by_loops(v, scores, pos, valid, threshold, needed=1):
    """The definition, one candidate pair at a time: ``needed`` near-copies ranked above."""
    b, h, n = scores.shape
    count = torch.zeros(b, h, n, dtype=torch.long)
    for bi in range(b):
        for hi in range(h):
            for i in range(n):
                for j in range(n):
                    if j == i or not valid[bi, hi, j]:
                        continue
                    si, sj = float(scores[bi, hi, i]), float(scores[bi, hi, j])
                    ranked_above = sj > si or (sj == si and int(pos[bi, hi, j]) < int(pos[bi, hi, i]))
                    a, c = v[bi, hi, i].double(), v[bi, hi, j].double()
                    cos = float(a @ c / (a.norm().clamp_min(1e-12) * c.norm().clamp_min(1e-12)))
                    if ranked_above and cos >= threshold - 1e-5:
                        count[bi, hi, i] += 1
    return (count >= needed) & valid  # an empty slot repeats nothing


@settings(max_examples=60)
@given(
    n=st.integers(2, 9),
    h=st.integers(1, 2),
    copies=st.integers(0, 4),
    threshold=st.sampled_from([1e-6, 0.5, 0.9, 0.99, 1.0]),
    tie=st.booleans(),
    needed=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_repeats_match_the_pairwise_definition(n, h, copies, threshold, tie, needed, seed):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(1, h, n, 3, generator=g)
    # Plant exact copies (scaled: a repeat is a direction) so the threshold is reached at 1.0 too.
    for c in range(min(copies, n - 1)):
        v[0, :, c + 1] = v[0, :, 0] * (1.0 + c)
    scores = torch.randint(0, 3, (1, h, n), generator=g).float() if tie else torch.randn(1, h, n, generator=g)
    pos = torch.randperm(n, generator=g).expand(1, h, n).clone()
    pos[..., -1] = torch.where(torch.rand(1, generator=g) < 0.3, -1, pos[..., -1])  # an empty slot
    valid = pos >= 0
    got = repeats(v, scores, pos, valid, threshold, needed)
    want = repeats_by_loops(v, scores, pos, valid, threshold, needed)
    assert torch.equal(got, want)
    assert torch.equal(repeats_reference(v, scores, pos, valid, threshold, needed), want)
    got = repeats(v, scores, pos, valid, threshold)
    for c in range(min(copies, n - 1)):
        if valid[0, 0, 0] and valid[0, 0, c + 1]:
            # of two exact copies exactly the lower-ranked one is a repeat
            a, b = (float(scores[0, 0, 0]), int(pos[0, 0, 0])), (float(scores[0, 0, c + 1]), -int(pos[0, 0, c + 1]))
            second = c + 1 if (a[0], -a[1]) > b else 0
            assert bool(got[0, 0, second])


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 400),
    copies=st.integers(0, 200),
    empty=st.integers(0, 50),
    tie=st.booleans(),
    threshold=st.sampled_from([0.8, 0.95]),
    needed=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 2**16),
)
def test_repeats_equal_the_pairwise_masks_at_a_cache_s_size(n, copies, empty, tie, threshold, needed, seed):
    """Property: at the sizes of a real update (hundreds of candidates, many near-copies, empty
    slots, tied scores) the rank-sorted computation flags exactly what every pair compared does."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(2, 3, n, 16, generator=g)
    source = torch.randint(0, n, (min(copies, n),), generator=g)
    target = torch.randint(0, n, (min(copies, n),), generator=g)
    v[:, :, target] = v[:, :, source] * 2 + 0.05 * torch.randn(2, 3, source.numel(), 16, generator=g)  # near-copies
    scores = torch.randint(0, 4, (2, 3, n), generator=g).float() if tie else torch.randn(2, 3, n, generator=g)
    pos = torch.stack([torch.randperm(n, generator=g) for _ in range(6)]).view(2, 3, n)
    pos[..., : min(empty, n)] = -1  # empty slots (invalid, several at one position)
    valid = pos >= 0
    assert torch.equal(repeats(v, scores, pos, valid, threshold, needed), repeats_reference(v, scores, pos, valid, threshold, needed))


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 120),
    ends=st.lists(st.integers(0, 120), min_size=6, max_size=6),
    accelerator=st.booleans(),
    needed=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_repeats_of_ragged_heads_equal_the_pairwise_masks(n, ends, accelerator, needed, seed):
    """Property: heads whose tokens end at different slots (per-head budgets: empty slots after
    each head's last token) flag what every pair compared does, whether each (row, head) is
    compared up to its last token (host devices) or over every slot (accelerators)."""
    import lola.core.checks as checks

    g = torch.Generator().manual_seed(seed)
    v = torch.randn(2, 3, n, 4, generator=g)
    v[..., 1::3, :] = v[..., ::3, :][..., : v[..., 1::3, :].shape[-2], :] + 0.01  # near-copies
    scores = torch.randn(2, 3, n, generator=g)
    pos = torch.stack([torch.randperm(n, generator=g) for _ in range(6)]).view(2, 3, n)
    for i, e in enumerate(ends):
        pos.view(6, n)[i, min(e, n) :] = -1
    valid = pos >= 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checks, "HOST_DEVICES", frozenset() if accelerator else checks.HOST_DEVICES)
        found = repeats(v, scores, pos, valid, 0.9, needed)
    assert torch.equal(found, repeats_reference(v, scores, pos, valid, 0.9, needed))


@settings(max_examples=60)
@given(n=st.integers(2, 10), copies=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_distinct_ranks_repeats_last_and_keeps_every_other_order(n, copies, seed):
    g = torch.Generator().manual_seed(seed)
    pos = torch.arange(n).view(1, 1, n)
    cand = KVBlock(torch.randn(1, 1, n, 3, generator=g), torch.randn(1, 1, n, 3, generator=g), pos)
    for c in range(min(copies, n - 1)):
        cand.v[0, 0, c + 1] = cand.v[0, 0, 0]
    inner = KeyNorm().score(cand, None)
    out = Distinct(policy="key_norm", threshold=0.999).score(cand, None)
    rep = repeats(cand.v, inner, pos, cand.valid, 0.999)[0, 0]
    assert int(rep.sum()) >= min(copies, n - 1)  # every planted copy but the best-ranked one
    kept, dropped = out[0, 0][~rep], out[0, 0][rep]
    if len(kept) and len(dropped):
        assert kept.min() > dropped.max()
    # Within each group the inner order is unchanged, and non-repeats keep their scores.
    for group in (~rep, rep):
        a, b = inner[0, 0][group], out[0, 0][group]
        assert torch.equal(a.argsort(), b.argsort())
    torch.testing.assert_close(out[0, 0][~rep], inner[0, 0][~rep])


def test_distinct_keeps_one_copy_the_older_on_a_tie_and_ignores_empty_slots():
    v = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [3.0, 0.0]]).view(1, 1, 4, 2)
    pos = torch.tensor([7, 3, 5, -1]).view(1, 1, 4)
    cand = KVBlock(torch.zeros(1, 1, 4, 2), v, pos)
    out = Distinct(policy="recency", threshold=0.9).score(cand, None)
    inner = Recency().score(cand, None)
    # pos 7 and pos 3 point the same way: recency ranks 7 higher, so 3 is the repeat; the empty
    # slot (same direction, but not a candidate) makes no repeat of anything.
    assert float(out[0, 0, 0]) == float(inner[0, 0, 0])
    assert float(out[0, 0, 2]) == float(inner[0, 0, 2])
    assert float(out[0, 0, 1]) < min(float(out[0, 0, 0]), float(out[0, 0, 2]))
    # equal scores: the older position stays
    tied = Distinct(policy="key_norm", threshold=0.9).score(KVBlock(torch.ones(1, 1, 4, 2), v, pos), None)
    assert float(tied[0, 0, 1]) > float(tied[0, 0, 0])


def test_distinct_keeps_as_many_copies_as_asked():
    # four copies of one direction, ranked by recency (newest first), and one other value
    v = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [4.0, 0.0], [0.0, 1.0]]).view(1, 1, 5, 2)
    cand = KVBlock(torch.zeros(1, 1, 5, 2), v, torch.arange(5).view(1, 1, 5))
    for copies, folded in ((1, [0, 1, 2]), (2, [0, 1]), (3, [0]), (4, [])):
        out = Distinct(policy="recency", threshold=0.9, copies=copies).score(cand, None)[0, 0]
        kept = [i for i in range(5) if i not in folded]
        assert all(float(out[i]) < min(float(out[j]) for j in kept) for i in folded), (copies, out)


def test_distinct_validates_and_builds_by_name():
    for bad in (0.0, 1.5, -1, "x", True):
        with pytest.raises(ValueError, match="threshold"):
            Distinct(threshold=bad)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="copies"):
            Distinct(copies=bad)
    with pytest.raises(KeyError, match="unknown policy"):
        Distinct(policy="nope")
    assert Distinct(policy="attention").needs_attention
    cfg = lola.LoLAConfig(window=2, sparse_size=3, chunk=2, policy="distinct", policy_kwargs={"policy": "sre", "threshold": 0.9})
    attn = lola.compose(cfg, num_heads=2, head_dim=4)
    v = torch.randn(1, 1, 2, 4).expand(1, 12, 2, 4).contiguous()  # one value repeated: the cache keeps one copy
    o, state = attn(torch.randn(1, 12, 2, 4), torch.randn(1, 12, 2, 4), v)
    assert torch.isfinite(o).all()


# -- ScoredAtExit ---------------------------------------------------------------------------------
@dataclass
class Drawn:
    """A score drawn afresh at every call (so re-scoring changes the ranking), recording the
    first score each (row, storage head, position) was given."""

    seed: int = 0
    needs_attention = False

    def __post_init__(self) -> None:
        self.gen = torch.Generator().manual_seed(self.seed)
        self.first: dict[tuple[int, int, int], float] = {}

    def score(self, candidates, ctx):
        s = torch.rand(candidates.pos.shape, generator=self.gen) * 4 - 1  # negative ones too
        for b, h, n in candidates.valid.nonzero().tolist():
            self.first.setdefault((b, h, int(candidates.pos[b, h, n])), float(s[b, h, n]))
        return s


@dataclass
class DrawnAll(Drawn):
    """:class:`Drawn`, recording the highest score each token was given."""

    def score(self, candidates, ctx):
        s = super().score(candidates, ctx)
        self.peak = getattr(self, "peak", {})
        self.calls = getattr(self, "calls", [])
        self.calls.append([((b, h, int(candidates.pos[b, h, n])), float(s[b, h, n])) for b, h, n in candidates.valid.nonzero().tolist()])
        for b, h, n in candidates.valid.nonzero().tolist():
            key = (b, h, int(candidates.pos[b, h, n]))
            self.peak[key] = max(self.peak.get(key, -math.inf), float(s[b, h, n]))
        return s


@pytest.fixture(scope="module")
def drawn():
    lola.policies.register("drawn_test", Drawn)
    lola.policies.register("drawn_all_test", DrawnAll)
    yield
    lola.policies.unregister("drawn_test")
    lola.policies.unregister("drawn_all_test")


DRAWN_SIZES = dict(t=st.integers(2, 40), window=st.integers(1, 5), sparse=st.integers(1, 6), chunk=st.integers(1, 4))
"""The sizes of a drawn run: sequence length, window, sparse cache, chunk (one sink always)."""

DRAWN_RUNS = dict(**DRAWN_SIZES, schedule=st.sampled_from(["chunkwise", "tokenwise"]), seed=seeds)
"""A run of :func:`run_drawn`: its sizes, schedule, seed."""


def drawn_layer(cfg: lola.LoLAConfig) -> lola.LoLAAttention:
    """The layer of the drawn runs: 4 query heads, 2 K/V heads, head size 4."""
    return lola.compose(cfg, num_heads=4, head_dim=4, num_kv_heads=2)


def drawn_inputs(b: int, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``q [b, t, 4, 4]``, ``k, v [b, t, 2, 4]`` for :func:`drawn_layer`, from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, t, h, 4, generator=g) for h in (4, 2, 2))
    return q, k, v


def run_drawn(policy, policy_kwargs, t, window, sparse, chunk, schedule, seed, b=2):
    cfg = lola.LoLAConfig(window=window, sparse_size=sparse, sinks=1, chunk=chunk, schedule=schedule, policy=policy, policy_kwargs=policy_kwargs)
    _, state = drawn_layer(cfg)(*drawn_inputs(b, t, seed))
    return state


def top_by_first_score(state, drawn):
    """Per (row, storage head): the ``λ`` positions that left the window with the best first score."""
    held = lambda block: {(b, h, int(p)) for (b, h, n), p in zip(block.valid.nonzero().tolist(), block.pos[block.valid])}  # noqa: E731
    in_window, in_sinks = held(state.window.block), held(state.sinks.block)
    out = {}
    for (b, h, p), s in drawn.first.items():
        if (b, h, p) not in in_window and (b, h, p) not in in_sinks:
            out.setdefault((b, h), []).append((s, p))
    return {key: sorted(p for _, p in sorted(xs, reverse=True)[: state.sparse.capacity]) for key, xs in out.items()}


@settings(max_examples=25, deadline=None)
@given(**DRAWN_RUNS)
def test_scored_at_exit_keeps_the_best_first_scores_of_every_token_that_left(drawn, t, window, sparse, chunk, schedule, seed):
    # Whatever the inner policy would say later, the cache is the top-λ, by the score each
    # token got when it first left the window, of every token that has left it; each slot's
    # tally is that score.
    state = run_drawn("at_exit", {"policy": "drawn_test", "policy_kwargs": {"seed": seed}}, t, window, sparse, chunk, schedule, seed)
    recorder = state.policy.parts[0]
    expected = top_by_first_score(state, recorder)
    block = state.sparse.block
    for b in range(block.pos.shape[0]):
        for h in range(block.pos.shape[1]):
            kept = block.pos[b, h][block.valid[b, h]]
            assert sorted(kept.tolist()) == expected.get((b, h), [])
            for n in block.valid[b, h].nonzero().flatten().tolist():
                assert float(block.acc[b, h, n]) == recorder.first[(b, h, int(block.pos[b, h, n]))]


@settings(max_examples=25, deadline=None)
@given(**DRAWN_RUNS)
def test_peak_score_ranks_a_cached_token_by_its_highest_score(drawn, t, window, sparse, chunk, schedule, seed):
    # Every candidate is scored at every step; a cached token's tally (its rank) is the highest
    # score it was given since it left the window, and the cache holds the top-λ of the last
    # step's candidates by those ranks.
    state = run_drawn("peak", {"policy": "drawn_all_test", "policy_kwargs": {"seed": seed}}, t, window, sparse, chunk, schedule, seed)
    recorder = state.policy.parts[0]
    block = state.sparse.block
    for b, h, n in block.valid.nonzero().tolist():
        assert float(block.acc[b, h, n]) == recorder.peak[(b, h, int(block.pos[b, h, n]))]
    # Which tokens stay: replay every step from the scores the inner policy gave, ranking a
    # cached token by its highest score so far and a token leaving the window by its first,
    # and keeping the top-λ per (row, storage head).
    rank: dict[tuple[int, int, int], float] = {}
    for call in getattr(recorder, "calls", []):
        ranked: dict[tuple[int, int], list[tuple[float, tuple[int, int, int]]]] = {}
        for key, now in call:
            ranked.setdefault(key[:2], []).append((max(rank.get(key, -math.inf), now), key))
        rank = {key: r for xs in ranked.values() for r, key in sorted(xs, reverse=True)[: state.sparse.capacity]}
    held = {(b, h, int(block.pos[b, h, n])) for b, h, n in block.valid.nonzero().tolist()}
    assert held == set(rank)
    with pytest.raises(ValueError, match="keeps its scores already"):
        PeakScore(policy="learned", policy_kwargs={"scorer": "smollm2-135m-instruct"})
    with pytest.raises(ValueError, match="tallies attention"):
        PeakScore(policy="attention")


def test_rescoring_every_step_keeps_other_tokens(drawn):
    # The property above can fail: the inner policy alone, re-scored at every step, does not
    # keep the best first scores.
    state = run_drawn("drawn_test", {"seed": 3}, 40, 2, 3, 2, "chunkwise", 3)
    expected = top_by_first_score(state, state.policy)
    kept = {(b, h): sorted(state.sparse.block.pos[b, h][state.sparse.block.valid[b, h]].tolist()) for b in range(2) for h in range(2)}
    assert kept != expected


@settings(max_examples=20, deadline=None)
@given(fold=st.booleans(), seed=seeds, **DRAWN_SIZES)
def test_a_score_of_the_token_alone_ranks_the_same_at_exit(t, window, sparse, chunk, fold, seed):
    # key_norm depends on the token alone: scored once at exit it keeps the same tokens and
    # gives the same outputs as scored at every step (inside `distinct` too, which still
    # folds repeats over every candidate at every step).
    inner = {"policy": "key_norm"}
    at_exit = {"policy": "at_exit", "policy_kwargs": inner}
    if fold:
        inner = {"policy": "distinct", "policy_kwargs": {"policy": "key_norm", "threshold": 0.5}}
        at_exit = {"policy": "distinct", "policy_kwargs": {"policy": "at_exit", "policy_kwargs": {"policy": "key_norm"}, "threshold": 0.5}}
    q, k, v = drawn_inputs(2, t, seed)
    outs = []
    for spec in (inner, at_exit):
        cfg = lola.LoLAConfig(window=window, sparse_size=sparse, sinks=1, chunk=chunk, mixing="lolcats", **spec)
        torch.manual_seed(seed)
        outs.append(drawn_layer(cfg)(q, k, v))
    (o1, s1), (o2, s2) = outs
    torch.testing.assert_close(s1.sparse.block.pos.sort(-1).values, s2.sparse.block.pos.sort(-1).values, rtol=0, atol=0)
    torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-6)


def test_scored_at_exit_state_round_trips_and_is_checked(drawn):
    state = run_drawn("at_exit", {"policy": "drawn_test"}, 24, 3, 4, 2, "chunkwise", 0)
    saved = {k: x.clone() for k, x in state.state_dict().items()}
    tallies = [k for k in saved if k.endswith(".acc")]
    assert tallies
    lola.engine.state_checks.check_state(saved, state)
    negative = {k: (x - 100.0 if k in tallies else x) for k, x in saved.items()}
    lola.engine.state_checks.check_state(negative, state)  # kept scores may be negative, unlike attention tallies
    bad = {k: (x.clone().fill_(float("inf")) if k in tallies else x) for k, x in saved.items()}
    with pytest.raises(ValueError, match="non-finite"):
        lola.engine.state_checks.check_state(bad, state)
    # A state saved by a policy that keeps no scores lacks them, and says so.
    with pytest.raises(ValueError, match="lacks them"):
        lola.engine.state_checks.check_state({k: x for k, x in saved.items() if k not in tallies}, state)


def test_scored_at_exit_refuses_what_it_cannot_hold():
    with pytest.raises(ValueError, match="tallies attention"):
        ScoredAtExit(policy="attention")
    with pytest.raises(ValueError, match="one part of a policy keeps scores"):
        Fusion(policies=["at_exit", "at_exit"])
    with pytest.raises(ValueError, match="tallies attention"):
        Fusion(policies=["at_exit", "attention"])
    with pytest.raises(ValueError, match="keeps its scores already"):
        ScoredAtExit(policy="at_exit")
    assert Distinct(policy="at_exit").keeps_scores and not Distinct(policy="sre").keeps_scores
    with pytest.raises(RuntimeError, match="LoLAMemory"):
        ScoredAtExit().score(cand_block([[[0, 1]]]), ctx_for(h=1, d=2)[0])


@dataclass(frozen=True)
class KeepsNothing:
    needs_attention = False
    keeps_scores = True

    def score(self, candidates, ctx):
        return torch.ones(candidates.pos.shape)


def test_a_policy_that_keeps_scores_must_set_them():
    lola.policies.register("keeps_nothing_test", KeepsNothing)
    try:
        with pytest.raises(RuntimeError, match="ctx.kept"):
            run_drawn("keeps_nothing_test", {}, 20, 2, 3, 2, "chunkwise", 0)
    finally:
        lola.policies.unregister("keeps_nothing_test")


@settings(max_examples=20, deadline=None)
@given(split=st.integers(1, 29), seed=seeds)
def test_span_pooling_among_the_cached_resumes_where_it_stopped(split, seed):
    """What is cached is the layer's state, not the call's: a prefill split in two gives the
    outputs and state of one call (the cache's tokens are known after a resume too)."""
    cfg = lola.LoLAConfig(window=4, sparse_size=5, sinks=1, chunk=4, policy="span", policy_kwargs={"policy": "sre", "radius": 2, "among": "cached"})
    attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(1, 30, 4, 8, generator=g), torch.randn(1, 30, 2, 8, generator=g), torch.randn(1, 30, 2, 8, generator=g)
    with torch.no_grad():
        whole, s_whole = attn(q, k, v)
        first, s_split = attn(q[:, :split], k[:, :split], v[:, :split])
        rest, s_split = attn(q[:, split:], k[:, split:], v[:, split:], state=s_split)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), whole, rtol=1e-4, atol=1e-5)
    for name, t in s_whole.state_dict().items():
        torch.testing.assert_close(s_split.state_dict()[name], t, rtol=1e-4, atol=1e-5)
