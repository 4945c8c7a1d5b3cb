"""A schedule that steps less often inside a call of many tokens (``Chunkwise(C, prefill_chunk=P)``):
the steps fall where it says, the call reads as the engine reads any schedule of those steps,
and between calls the state is that of ``Chunkwise(C)`` (its window, its bytes)."""

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola
import lola.engine.block_loop as block_loop
from lola.memory import SlidingWindow
from lola.schedules import Chunkwise
from tests.oracles import assert_rel_close


def _config(chunk: int, prefill: int | None, **kw) -> lola.LoLAConfig:
    base = dict(window=5, sparse_size=4, sinks=1, chunk=chunk, mixing="lola_authors", feature_map="hedgehog", feature_dim=8)
    return lola.LoLAConfig(**(base | kw), schedule_kwargs={} if prefill is None else {"prefill_chunk": prefill})


def _inputs(b: int, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, 4, 8, generator=g), torch.randn(b, t, 2, 8, generator=g), torch.randn(b, t, 2, 8, generator=g)


def _expected_steps(start: int, n: int, chunk: int, prefill: int) -> list[int]:
    """Counts (tokens seen) at the steps of a call of ``n`` tokens after ``start``, as the
    schedule's documentation states them."""
    if n == 1:
        return [start + 1] if (start + 1) % chunk == 0 else []
    end = start + n
    steps = {c for c in range(start + 1, end + 1) if c % prefill == 0}
    last = end - end % chunk
    if last > start:
        steps.add(last)
    return sorted(steps)


@settings(max_examples=40, deadline=None)
@given(
    chunk=st.integers(1, 5),
    factor=st.integers(2, 4),
    cuts=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    padded=st.booleans(),
)
def test_steps_fall_at_the_prefill_period_and_the_calls_last_chunk(chunk, factor, cuts, padded):
    prefill = chunk * factor
    steps: list[int] = []
    step = block_loop.step

    def logged(state, stepping, feature_map_k, scale):
        steps.append(int(state.seen[0]))
        step(state, stepping, feature_map_k, scale)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(block_loop, "step", logged)
        attn = lola.compose(_config(chunk, prefill, policy="recency"), num_heads=4, head_dim=8, num_kv_heads=2)
        seen, state = 0, None
        for i, n in enumerate(cuts):
            q, k, v = _inputs(1, n, seed=i)
            mask = torch.ones(1, n, dtype=torch.bool) if padded else None  # the device-side path when given
            steps.clear()
            with torch.no_grad():
                _, state = attn(q, k, v, state=state, padding_mask=mask)
            assert steps == _expected_steps(seen, n, chunk, prefill), (seen, n)
            seen += n
            # Between calls: the window of Chunkwise(C) and fewer than C tokens waiting in it.
            assert state.window.capacity == 5 + chunk and state.window.max_pending == chunk
            assert int(state.window.block.valid.sum(-1).max()) <= 5 + seen % chunk


@dataclass(frozen=True)
class _StepsAfter:
    """A schedule of explicit steps: after the tokens counted in ``counts``, then every ``chunk``."""

    counts: tuple[int, ...]
    chunk: int
    period: int

    def tokens_until_step(self, seen: torch.Tensor) -> torch.Tensor:
        out = []
        for s in seen.tolist():
            nxt = next((c for c in self.counts if c > s), (s // self.chunk + 1) * self.chunk)
            out.append(nxt - s)
        return torch.tensor(out, dtype=torch.long)


def _held(state) -> dict:
    """Each exact store's tokens by position (slot order aside) and the linear state."""
    out = {}
    for m in state.exact_memories:
        b = m.block
        for row in range(b.pos.shape[0]):
            for h in range(b.pos.shape[1]):
                keep = b.pos[row, h] >= 0
                order = torch.argsort(b.pos[row, h][keep])
                out[(m.name, row, h)] = (b.pos[row, h][keep][order], b.k[row, h][keep][order], b.v[row, h][keep][order])
    out["linear"] = state.linear.state
    return out


@settings(max_examples=25, deadline=None)
@given(
    chunk=st.integers(1, 4),
    factor=st.integers(2, 4),
    t=st.integers(2, 60),
    decode=st.integers(0, 9),
    policy=st.sampled_from(["sre", "recency", "key_norm"]),
    seed=st.integers(0, 3),
)
def test_a_prefill_reads_as_the_engine_reads_a_schedule_of_its_steps(chunk, factor, t, decode, policy, seed):
    """The prefill (window grown for the call, shrunk after) equals the plain engine run with an
    explicit schedule of the same steps and a window of the prefill period, then decoding on."""
    prefill = chunk * factor
    torch.manual_seed(seed)
    attn = lola.compose(_config(chunk, prefill, policy=policy), num_heads=4, head_dim=8, num_kv_heads=2)
    explicit = _StepsAfter(tuple(_expected_steps(0, t, chunk, prefill)), chunk, prefill)
    make = attn.memory_factory

    def reference_memory():
        mem = make()
        return lola.LoLAMemory(
            sinks=mem.sinks, window=SlidingWindow(5, max_pending=prefill), sparse=mem.sparse, linear=mem.linear, policy=mem.policy, schedule=explicit
        )

    ref = lola.LoLAAttention(4, 8, 2, memory_factory=reference_memory, feature_map_q=attn.feature_map_q, feature_map_k=attn.feature_map_k, mixing=attn.mixing)
    ref.window_factors = attn.window_factors
    q, k, v = _inputs(2, t + decode, seed)
    with torch.no_grad():
        out, state = attn(q[:, :t], k[:, :t], v[:, :t])
        want, ref_state = ref(q[:, :t], k[:, :t], v[:, :t])
        torch.testing.assert_close(out, want, rtol=0, atol=0)  # the same blocks, the same arithmetic
        for i in range(t, t + decode):
            o, state = attn(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)
            w, ref_state = ref(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=ref_state)
            assert_rel_close(w, o, 1e-5, f"decoded token {i}")  # the same tokens in other ring slots
    got, expect = _held(state), _held(ref_state)
    assert got.keys() == expect.keys()
    for key in expect:
        for a, b in zip(got[key], expect[key]):
            torch.testing.assert_close(a, b)


@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(3, 40), min_size=2, max_size=3), seed=st.integers(0, 3))
def test_rows_of_a_padded_batch_step_as_each_alone(lengths, seed):
    torch.manual_seed(seed)
    attn = lola.compose(_config(3, 9), num_heads=4, head_dim=8, num_kv_heads=2)
    t = max(lengths)
    q, k, v = _inputs(len(lengths), t, seed)
    mask = torch.arange(t)[None, :] >= (t - torch.tensor(lengths))[:, None]  # left padding
    with torch.no_grad():
        out, _ = attn(q, k, v, padding_mask=mask)
        for row, n in enumerate(lengths):
            alone, _ = attn(q[row : row + 1, t - n :], k[row : row + 1, t - n :], v[row : row + 1, t - n :])
            assert_rel_close(alone[0], out[row, t - n :], 1e-5, f"row {row}")


def test_the_state_between_calls_has_the_bytes_of_the_decode_chunk():
    q, k, v = _inputs(2, 77, 0)
    with torch.no_grad():
        _, big = lola.compose(_config(4, 16), num_heads=4, head_dim=8, num_kv_heads=2)(q, k, v)
        _, small = lola.compose(_config(4, None), num_heads=4, head_dim=8, num_kv_heads=2)(q, k, v)
    assert big.nbytes() == small.nbytes()
    assert {n: t.shape for n, t in big.state_dict().items()} == {n: t.shape for n, t in small.state_dict().items()}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk": 4, "prefill_chunk": 6}, "prefill_chunk must be a multiple of chunk"),
        ({"chunk": 4, "prefill_chunk": 2}, "prefill_chunk must be a multiple of chunk"),
        ({"chunk": 4, "prefill_chunk": True}, "prefill_chunk must be a multiple of chunk"),
    ],
)
def test_prefill_chunk_must_be_a_multiple_of_the_chunk(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Chunkwise(**kwargs)


def test_prefill_chunk_equal_to_the_chunk_is_the_plain_schedule():
    q, k, v = _inputs(1, 50, 1)
    torch.manual_seed(0)
    a = lola.compose(_config(4, 4), num_heads=4, head_dim=8, num_kv_heads=2)
    torch.manual_seed(0)
    b = lola.compose(_config(4, None), num_heads=4, head_dim=8, num_kv_heads=2)
    with torch.no_grad():
        torch.testing.assert_close(a(q, k, v)[0], b(q, k, v)[0], rtol=0, atol=0)
