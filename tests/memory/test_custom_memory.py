"""A third party plugs memories lola does not ship into a LoLA layer, through the public API only.

``Int8SparseCache`` subclasses :class:`lola.memory.SparseCache` and stores keys and values as
int8 with one scale per slot; ``CountingLinearState`` subclasses nothing and stands in for the
linear state. The layers are built as a user would build them (``docs/guides/custom_cache.md``
shows the same ``Int8SparseCache``, and a test below keeps the two copies identical): only
names exported by ``lola``, ``lola.memory``, ``lola.policies``, ``lola.schedules`` and
``lola.feature_maps`` are used, and no underscore attribute of a lola object.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

import lola
from lola.feature_maps import build_feature_map
from lola.memory import KVBlock, SparseCache
from tests.docs.test_guides import python_blocks
from tests.oracles import assert_rel_close, rel_err

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "custom_cache.md"


# The class as the guide shows it (test_the_guide_shows_this_class keeps the copies identical).
class Int8SparseCache(SparseCache):
    """A sparse cache that stores keys and values as int8, with one scale per slot.

    Each slot's key (and value) ``x`` is quantised symmetrically: ``scale = max|x| / 127`` and
    ``code = round(x / scale)``, so every element is off by at most ``scale / 2``. Scales are
    kept in the layer's dtype, which is also the dtype of the dequantised :attr:`block` that
    the composer and the policy read. One size for every head (no per-head sizes).
    """

    def __init__(self, size: int) -> None:
        if not isinstance(size, int):
            raise TypeError(f"Int8SparseCache takes one size for every head, got {size!r}")
        self.stored: dict[str, torch.Tensor] | None = None  # k, v int8; k_scale, v_scale; pos; acc
        super().__init__(size)

    def __repr__(self) -> str:  # part of the layer's spec: a plain SparseCache state is refused
        return f"Int8SparseCache({self.capacity})"

    @staticmethod
    def quantise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [B, Hs, N, D]`` -> int8 codes ``[B, Hs, N, D]`` and scales ``[B, Hs, N]`` (x's dtype)."""
        scale = (x.float().abs().amax(dim=-1) / 127).to(x.dtype)
        step = scale.float().clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1)
        return torch.round(x.float() / step).clamp(-127, 127).to(torch.int8), scale

    @staticmethod
    def dequantise(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return (codes.float() * scale.float().unsqueeze(-1)).to(scale.dtype)

    # The composer, the policy and SparseCache.select read and assign `block`: a dequantised
    # view built on demand (assign a new block, do not write into its tensors).
    @property
    def block(self) -> KVBlock | None:  # type: ignore[override]
        s = self.stored
        if s is None:
            return None
        k, v = self.dequantise(s["k"], s["k_scale"]), self.dequantise(s["v"], s["v_scale"])
        return KVBlock(k, v, s["pos"], s.get("acc"))

    @block.setter
    def block(self, value: KVBlock | None) -> None:
        if value is None:
            self.stored = None
            return
        (k, k_scale), (v, v_scale) = self.quantise(value.k), self.quantise(value.v)
        self.stored = {"k": k, "v": v, "k_scale": k_scale, "v_scale": v_scale, "pos": value.pos}
        if value.acc is not None:
            self.stored["acc"] = value.acc

    def allocate(self, batch: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, track_attention: bool) -> None:
        n = self.capacity
        self.stored = {
            "k": torch.zeros(batch, heads, n, head_dim, dtype=torch.int8, device=device),
            "v": torch.zeros(batch, heads, n, head_dim, dtype=torch.int8, device=device),
            "k_scale": torch.zeros(batch, heads, n, dtype=dtype, device=device),
            "v_scale": torch.zeros(batch, heads, n, dtype=dtype, device=device),
            "pos": torch.full((batch, heads, n), -1, dtype=torch.long, device=device),  # -1: empty
        }
        if track_attention:
            self.stored["acc"] = torch.zeros(batch, heads, n, device=device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self.stored is None else dict(self.stored)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if not state:
            self.stored = None
            return
        names = {"k", "v", "k_scale", "v_scale", "pos"}
        if not names <= state.keys() <= names | {"acc"}:
            raise ValueError(f"Int8SparseCache state must hold {sorted(names)} (and maybe 'acc'), got {sorted(state)}")
        k, v = state["k"], state["v"]
        if k.dtype != torch.int8 or v.dtype != torch.int8:
            raise ValueError(f"Int8SparseCache state must hold int8 k and v, got {k.dtype} and {v.dtype}")
        if k.dim() != 4 or k.shape != v.shape or k.shape[2] != self.capacity or any(state[n].shape != k.shape[:3] for n in ("k_scale", "v_scale", "pos")):
            raise ValueError(f"Int8SparseCache state must hold k, v [B, Hs, {self.capacity}, D] and scales, pos [B, Hs, {self.capacity}]")
        self.stored = {name: t.clone() for name, t in state.items()}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state_dict().values())


class CountingLinearState:
    """A linear state that subclasses nothing: the sums of :class:`lola.memory.LinearState`
    plus ``count [B, H]``, the tokens folded into them (saved with the state).

    It has the members of the linear-state role: ``name``, ``allocated``, ``allocate``,
    ``read``, ``write``, ``state``, ``nbytes``, ``state_dict``, ``load_state_dict`` and
    ``reset`` (and ``H``, ``s`` as attributes, as :class:`~lola.memory.LinearState` has).
    """

    name = "linear"

    def __init__(self) -> None:
        self.H = self.s = self.count = None

    @property
    def allocated(self) -> bool:
        return self.H is not None

    def allocate(self, batch: int, heads: int, feature_dim: int, head_dim: int, device: torch.device) -> None:
        self.H = torch.zeros(batch, heads, feature_dim, head_dim, device=device)
        self.s = torch.zeros(batch, heads, feature_dim, device=device)
        self.count = torch.zeros(batch, heads, dtype=torch.long, device=device)

    @property
    def state(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.H is None:
            raise RuntimeError("CountingLinearState is not allocated")
        return self.H, self.s

    def read(self, query: lola.memory.QueryBlock) -> lola.LinearPartial:
        fq = query.fq.float()
        return lola.LinearPartial(num=torch.matmul(fq, self.H), den=torch.matmul(fq, self.s.unsqueeze(-1)).squeeze(-1))

    def write(self, fk: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> None:
        fk = torch.where(mask.unsqueeze(-1), fk.float(), 0.0)
        self.H = self.H + torch.matmul(fk.transpose(-1, -2), torch.where(mask.unsqueeze(-1), v.float(), 0.0))
        self.s = self.s + fk.sum(dim=2)
        self.count = self.count + mask.sum(dim=2)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self.H is None else {"H": self.H, "s": self.s, "count": self.count}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if not state:
            self.reset()
            return
        if set(state) != {"H", "s", "count"}:
            raise ValueError(f"CountingLinearState state must hold H, s and count, got {sorted(state)}")
        self.H, self.s, self.count = (state[n].clone() for n in ("H", "s", "count"))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state_dict().values())

    def reset(self) -> None:
        self.H = self.s = self.count = None


# -- the layers ----------------------------------------------------------------------------------
B, H, H_KV, D = 2, 4, 2, 32
WINDOW, SPARSE, SINKS, CHUNK = 16, 16, 2, 8
PREFILL, DECODE = 100, 20


def make_layer(sparse: type = SparseCache, linear: type | None = None, policy: str = "sre", size: int = SPARSE) -> lola.LoLAAttention:
    """The layer a user builds: sinks + window + a ``sparse`` cache of ``size`` slots (+ a
    ``linear`` state), scored by ``policy``, chunkwise."""

    def new_memory() -> lola.LoLAMemory:
        schedule = lola.schedules.build("chunkwise", chunk=CHUNK)
        return lola.LoLAMemory(
            window=lola.memory.SlidingWindow(WINDOW, max_pending=schedule.period),
            sparse=sparse(size),
            policy=lola.policies.build(policy),
            schedule=schedule,
            sinks=lola.memory.SinkTokens(SINKS),
            linear=None if linear is None else linear(),
        )

    attn = lola.LoLAAttention(
        H,
        D,
        H_KV,
        memory_factory=new_memory,
        feature_map_q=build_feature_map("elu", H, D),
        feature_map_k=build_feature_map("elu", H, D),
        mixing="lolcats",
    )
    with torch.no_grad():  # distinct gates per head (the same in every layer built here)
        attn.window_factors.copy_(torch.linspace(-2.0, 2.0, H).view(1, H, 1, 1))
    return attn


def inputs(t: int = PREFILL + DECODE, seed: int = 0, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, t, H, D, generator=g)
    k, v = torch.randn(B, t, H_KV, D, generator=g), torch.randn(B, t, H_KV, D, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def run(attn: lola.LoLAAttention, q, k, v, cuts: list[int], state: lola.LoLAMemory | None = None):
    """Run the segments between ``cuts``, passing the state along; the outputs concatenated."""
    outs = []
    bounds = [0, *cuts, q.shape[1]]
    for a, b in zip(bounds[:-1], bounds[1:]):
        o, state = attn(q[:, a:b], k[:, a:b], v[:, a:b], state=state)
        outs.append(o)
    return torch.cat(outs, dim=1), state


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Bit-identical states; the window's empty slots excepted (SlidingWindow.load_state_dict
    places the held tokens in a zeroed ring, so what empty slots held before is not kept)."""
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        assert x.dtype == y.dtype and x.shape == y.shape, name
        if name in ("window.k", "window.v"):
            x, y = x[a["window.pos"] >= 0], y[b["window.pos"] >= 0]
        assert torch.equal(x, y), name


PREFILL_THEN_DECODE = [PREFILL, *range(PREFILL + 1, PREFILL + DECODE)]  # one call, then one token per call


# -- (a) it runs, and it is int8 -----------------------------------------------------------------
# Two set-ups in which the plain and the int8 cache hold the same tokens, so that what differs is
# the quantisation alone: SRE with a cache large enough for every token the window lets go
# (nothing is ever evicted, the linear state stays empty), and a cache of 16 slots under eviction
# with a policy that does not look at the values (Recency: the dequantised tokens the int8 cache
# evicts reach the linear state). With SRE *and* eviction the two layers may keep different
# tokens: SRE scores the dequantised keys, and a near-tie flips (seen here: 0.03% apart at rank
# λ), which swaps a token between exact and linear memory and moves the outputs of the tokens
# read meanwhile by ~10% here: a property of the policy, not an error of the cache.
SETUPS = {"sre_no_eviction": ("sre", PREFILL + DECODE - WINDOW - SINKS), "recency_eviction": ("recency", SPARSE)}


@pytest.mark.parametrize("setup", sorted(SETUPS))
@torch.no_grad()
def test_int8_cache_is_close_to_the_plain_cache_but_not_equal(setup):
    policy, size = SETUPS[setup]
    q, k, v = inputs()
    o_ref, s_ref = run(make_layer(SparseCache, policy=policy, size=size), q, k, v, PREFILL_THEN_DECODE)
    o_int8, s_int8 = run(make_layer(Int8SparseCache, policy=policy, size=size), q, k, v, PREFILL_THEN_DECODE)
    assert isinstance(s_int8.sparse, Int8SparseCache)
    assert s_int8.decodes_fused  # reads_block is inherited: the decode steps took the fused path
    assert int(s_int8.seen.min()) == PREFILL + DECODE
    assert torch.equal(s_ref.sparse.block.pos.sort(-1).values, s_int8.sparse.block.pos.sort(-1).values)  # same tokens
    evicted = bool(s_int8.linear.s.abs().sum() > 0)
    assert evicted == (setup == "recency_eviction")

    # Per element the cache is off by at most scale/2 = max|x|/254 of its slot; the rounding
    # error is about uniform, RMS scale/√12 = max|x|/440 ≈ 0.5% of a slot's RMS for Gaussian
    # vectors in D = 32 (max|x| ≈ 2.3·RMS). Logits and values move by that much, and so do the
    # outputs (observed: 3.3e-3 and 3.5e-3); 2e-2 leaves a margin of 4 while a real bug (a wrong
    # slot, a wrong scale, a lost token, a dropped sign) costs O(1).
    err = rel_err(o_ref, o_int8)
    assert err < 2e-2, f"relative RMSE {err:.2e}"
    assert not torch.equal(o_ref, o_int8), "the outputs are bit-identical: was anything quantised?"

    # Every cached slot holds its token, off by at most half its scale (and not all exactly).
    block, stored = s_int8.sparse.block, s_int8.sparse.state_dict()
    held = block.pos >= 0
    assert int(held.sum()) == B * H_KV * min(size, PREFILL + DECODE - WINDOW - SINKS)
    src = torch.arange(B)[:, None, None], block.pos.clamp(min=0), torch.arange(H_KV)[None, :, None]
    for name, x in (("k", k), ("v", v)):
        original = x[src]  # [B, Hs, N, D]: the token each slot holds
        bound = stored[f"{name}_scale"].unsqueeze(-1) / 2 * (1 + 1e-6) + 1e-30
        assert bool(((getattr(block, name) - original).abs() <= bound)[held].all()), name
        assert not torch.equal(getattr(block, name)[held], original[held]), name


def test_requantising_the_dequantised_block_changes_nothing():
    # SparseCache.select assigns the kept slots back at every step: no drift.
    cache = Int8SparseCache(5)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, 8, generator=g) * torch.rand(2, 3, 5, 1, generator=g) * 10
    cache.block = KVBlock(x, -x, torch.arange(30).view(2, 3, 5))
    before = {n: t.clone() for n, t in cache.state_dict().items()}
    cache.block = cache.block
    after = cache.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)


# -- (b) the bytes ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_state_holds_int8_and_saves_the_expected_bytes(dtype):
    q, k, v = inputs(PREFILL + 3, dtype=dtype)
    _, s_ref = run(make_layer(SparseCache), q, k, v, [PREFILL])
    _, s_int8 = run(make_layer(Int8SparseCache), q, k, v, [PREFILL])
    state = s_int8.state_dict()
    assert state["sparse.k"].dtype == state["sparse.v"].dtype == torch.int8
    assert state["sparse.k"].shape == (B, H_KV, SPARSE, D)
    assert state["sparse.k_scale"].shape == state["sparse.v_scale"].shape == (B, H_KV, SPARSE)
    assert state["sparse.k_scale"].dtype == dtype and s_int8.sparse.block.k.dtype == dtype
    assert state.keys() - s_ref.state_dict().keys() == {"sparse.k_scale", "sparse.v_scale"}

    # Per slot, k and v go from D elements of `dtype` each to D int8 codes plus one `dtype` scale.
    elt = torch.empty((), dtype=dtype).element_size()
    slots = B * H_KV * SPARSE
    assert s_int8.sparse.nbytes() == slots * (2 * D * 1 + 2 * elt + 8)  # codes, scales, int64 pos
    saved = slots * (2 * D * elt - (2 * D * 1 + 2 * elt))
    assert s_ref.nbytes() - s_int8.nbytes() == saved
    assert s_int8.nbytes() < s_ref.nbytes()


# -- (c) save and restore ----------------------------------------------------------------------
@torch.no_grad()
def test_state_round_trip_continues_bit_identically():
    q, k, v = inputs(PREFILL + 3 + 24)
    attn = make_layer(Int8SparseCache)
    _, state = run(attn, q[:, : PREFILL + 3], k[:, : PREFILL + 3], v[:, : PREFILL + 3], [PREFILL, PREFILL + 1, PREFILL + 2])
    saved = {n: t.clone() for n, t in state.state_dict().items()}  # the state keeps writing in place
    assert saved["sparse.k"].dtype == torch.int8

    restored = attn.new_state()
    restored.load_state_dict(saved)
    assert_same_state(saved, restored.state_dict())

    # Continue both: single tokens across a step, then a segment across two more.
    rest = [slice(PREFILL + 3 + i, PREFILL + 4 + i) for i in range(8)] + [slice(PREFILL + 11, None)]
    for part in rest:
        o_a, state = attn(q[:, part], k[:, part], v[:, part], state=state)
        o_b, restored = attn(q[:, part], k[:, part], v[:, part], state=restored)
        assert torch.equal(o_a, o_b)
    assert_same_state(state.state_dict(), restored.state_dict())


@torch.no_grad()
def test_a_plain_cache_state_is_refused():
    q, k, v = inputs(PREFILL)
    _, plain = make_layer(SparseCache)(q, k, v)
    attn = make_layer(Int8SparseCache)
    with pytest.raises(ValueError, match="Int8SparseCache state must hold"):
        attn.new_state().load_state_dict(plain.state_dict())
    with pytest.raises(ValueError, match="another configuration"):  # the spec names the class
        attn(q[:, :1], k[:, :1], v[:, :1], state=plain)


# -- (d) split invariance ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cuts", [[37, 64, 65, 66, 99, 100, 101, 102, 103, 104, 105], PREFILL_THEN_DECODE, list(range(1, 41))], ids=["pieces", "decode", "token_by_token"]
)
@torch.no_grad()
def test_one_call_equals_the_same_tokens_in_pieces(cuts):
    t = cuts[-1] + 9
    q, k, v = inputs(t)
    attn = make_layer(Int8SparseCache)
    o_one, s_one = attn(q, k, v)
    o_split, s_split = run(attn, q, k, v, cuts)
    assert_rel_close(o_one, o_split, 1e-5)  # the tolerance of tests/test_invariants.py

    assert torch.equal(s_one.seen, s_split.seen)
    for name in ("H", "s"):
        assert_rel_close(getattr(s_one.linear, name), getattr(s_split.linear, name), 1e-5, name)
    # The same tokens are cached with the same codes (slot order inside the cache is free).
    a, b = s_one.sparse.state_dict(), s_split.sparse.state_dict()
    order_a, order_b = a["pos"].argsort(-1), b["pos"].argsort(-1)
    for name in ("pos", "k_scale", "v_scale"):
        assert torch.equal(a[name].gather(-1, order_a), b[name].gather(-1, order_b)), name
    for name in ("k", "v"):
        idx_a, idx_b = (o.unsqueeze(-1).expand(-1, -1, -1, D) for o in (order_a, order_b))
        assert torch.equal(a[name].gather(2, idx_a), b[name].gather(2, idx_b)), name


# -- (e) a memory that subclasses nothing ----------------------------------------------------------
@torch.no_grad()
def test_a_linear_state_that_subclasses_nothing():
    q, k, v = inputs()
    o_ref, s_ref = run(make_layer(SparseCache), q, k, v, PREFILL_THEN_DECODE)
    attn = make_layer(SparseCache, linear=CountingLinearState)
    o, state = run(attn, q, k, v, PREFILL_THEN_DECODE)
    assert not isinstance(state.linear, lola.memory.LinearState) and type(state.linear).__mro__ == (CountingLinearState, object)
    assert torch.equal(o_ref, o)  # the same sums, computed the same way
    assert torch.equal(s_ref.linear.H, state.linear.H) and torch.equal(s_ref.linear.s, state.linear.s)

    # Every token is in exactly one memory: count = tokens seen - tokens held exact.
    held = torch.cat([m.block.pos for m in state.exact_memories], dim=-1)  # [B, Hs, ·]
    exact = (held >= 0).sum(-1).repeat_interleave(H // H_KV, dim=1)  # per query head
    assert torch.equal(state.linear.count, state.seen[:, None] - exact)
    assert int(state.linear.count.min()) > 0

    saved = {n: t.clone() for n, t in state.state_dict().items()}
    assert "linear.count" in saved and state.nbytes() == s_ref.nbytes() + saved["linear.count"].nbytes
    restored = attn.new_state()
    restored.load_state_dict(saved)
    q2, k2, v2 = inputs(12, seed=1)
    o_a, _ = run(attn, q2, k2, v2, list(range(1, 12)), state=state)
    o_b, _ = run(attn, q2, k2, v2, list(range(1, 12)), state=restored)
    assert torch.equal(o_a, o_b)


@torch.no_grad()
def test_both_custom_memories_together():
    q, k, v = inputs()
    o_ref, _ = run(make_layer(Int8SparseCache), q, k, v, PREFILL_THEN_DECODE)
    o, state = run(make_layer(Int8SparseCache, linear=CountingLinearState), q, k, v, PREFILL_THEN_DECODE)
    assert torch.equal(o_ref, o)
    assert {"sparse.k_scale", "linear.count"} <= state.state_dict().keys()


# -- the guide -------------------------------------------------------------------------------------
def test_the_guide_shows_this_class():
    text = GUIDE.read_text(encoding="utf-8")
    shown = []
    for _, source in python_blocks(text):
        for node in ast.parse(source).body:
            if isinstance(node, ast.ClassDef) and node.name == "Int8SparseCache":
                shown.append(ast.get_source_segment(source, node, padded=True))
    assert len(shown) == 1, "docs/guides/custom_cache.md must show Int8SparseCache once, in a tested python block"
    assert shown[0] == inspect.getsource(Int8SparseCache).rstrip("\n"), "the guide's Int8SparseCache differs from this file's"
