"""The block loop (lola.engine.block_loop): blocks end where the schedule steps, every query is
read once, and the query a step falls on reads the state after that step."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lola
import lola.engine.block_loop as block_loop
from lola.engine.decode_read import DecodeRead
from lola.engine.segment_reads import SegmentReads


def _inputs(b, t, h, hkv, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, h, d, generator=g), torch.randn(b, t, hkv, d, generator=g), torch.randn(b, t, hkv, d, generator=g)


def _record(monkeypatch):
    """Log of the loop's calls: ``("step", seen)`` at each step, ``("read", start, count)`` at
    each read (packed indices of the segment), a segment's reads and a decoded token's alike."""
    log = []
    step = block_loop.step

    def logged_step(state, stepping, feature_map_k, scale):
        log.append(("step", int(state.seen[0])))
        step(state, stepping, feature_map_k, scale)

    def logging(add):
        def logged_add(self, start, count):
            log.append(("read", int(start), int(count)))
            add(self, start, count)

        return logged_add

    monkeypatch.setattr(block_loop, "step", logged_step)
    for reads in (SegmentReads, DecodeRead):
        monkeypatch.setattr(reads, "add", logging(reads.add))
    return log


@settings(max_examples=30, deadline=None)
@given(chunk=st.integers(1, 9), cuts=st.lists(st.integers(1, 12), min_size=1, max_size=4), padded=st.booleans())
def test_blocks_end_at_steps_and_every_query_is_read_once_after_the_steps_before_it(chunk, cuts, padded):
    with pytest.MonkeyPatch.context() as mp:
        log = _record(mp)
        cfg = lola.LoLAConfig(window=4, sparse_size=2, sinks=1, chunk=chunk, policy="recency")
        attn = lola.compose(cfg, num_heads=2, head_dim=8, num_kv_heads=1)
        seen, state = 0, None
        for i, n in enumerate(cuts):
            q, k, v = _inputs(1, n, 2, 1, 8, seed=i)
            mask = torch.ones(1, n, dtype=torch.bool) if padded else None  # the device-side path when given
            log.clear()
            with torch.no_grad():
                _, state = attn(q, k, v, state=state, padding_mask=mask)
            steps = [e[1] for e in log if e[0] == "step"]
            # A step falls after every chunk-th token of the sequence (its count at the step).
            assert steps == [c for c in range(seen + 1, seen + n + 1) if c % chunk == 0]
            # The reads cover the segment's queries once each, in order; a query whose token a
            # step fell on is read after that step.
            read, after = 0, {}
            steps_done = 0
            for e in log:
                if e[0] == "step":
                    steps_done += 1
                    continue
                _, start, count = e
                assert start == read
                for j in range(start, start + count):
                    after[seen + j + 1] = steps_done  # the token's count → steps run before its read
                read += count
            assert read == n
            for count, done in after.items():
                assert done == sum(1 for s in steps if s <= count)
            seen += n


@pytest.mark.parametrize("chunk", [1, 4])
def test_one_token_per_call_steps_where_the_schedule_says(monkeypatch, chunk):
    log = _record(monkeypatch)
    cfg = lola.LoLAConfig(window=4, sparse_size=2, sinks=1, chunk=chunk, policy="recency")
    attn = lola.compose(cfg, num_heads=2, head_dim=8, num_kv_heads=1)
    q, k, v = _inputs(1, 10, 2, 1, 8)
    state = None
    with torch.no_grad():
        for i in range(10):
            _, state = attn(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], state=state)
    assert [e[1] for e in log if e[0] == "step"] == [c for c in range(1, 11) if c % chunk == 0]
