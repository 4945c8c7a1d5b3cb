"""The block loop of prefill and decode alike: a segment runs in blocks that end at schedule steps.

A block's tokens are written (:func:`write_block`), its queries are read (the reads object's
``add``: the query a step fell on before, and the block's queries up to, not including, the one
its own step falls on), then the step runs (:func:`lola.engine.select_step.step`); the query a
step falls on is read with the next block, against the state after the step.
"""

from __future__ import annotations

import torch

from lola.engine.decode_read import DecodeRead
from lola.engine.row_counts import ask_prefill, ask_schedule, check_until
from lola.engine.segment_reads import SegmentReads, gather_tokens
from lola.engine.select_step import FeatureFn, step
from lola.engine.state import LayerState, Written
from lola.engine.state_pages import sync

__all__ = ["run_blocks", "write_block"]


def run_blocks(
    state: LayerState,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    valid: torch.Tensor | None,
    scale: float,
    feature_map_k: FeatureFn,
    reads: SegmentReads | DecodeRead,
    host: bool,
) -> None:
    """The block loop of prefill and decode alike: blocks end at schedule steps; a block's
    tokens are written, its queries are read (``reads.add``: the carried query and the
    block's queries up to, not including, one a step falls on), then the step runs; a query a
    step falls on is read with the next block, against the state after the step.

    Args:
        q: ``[B, H, T, D]``; k, v: ``[B, Hs, T, D]``, each row's real tokens packed to the left.
        valid: ``[B, T]`` real tokens (only read when not ``host``).
        reads: where the queries' reads go (:class:`~lola.engine.segment_reads.SegmentReads` for
            partials, :class:`~lola.engine.decode_read.DecodeRead` for one mixed token per row).
        host: every row takes all ``T`` tokens and each block's length is known on the host:
            rows at one position (they share every block boundary), or ``T = 1`` (each row's
            own step, if it falls on its token, runs before the read; a step changes only its
            own rows, so the rows that do not step read the same state either way). Blocks are
            then slices and no device value is read. Else the rows' blocks are asked of the
            schedule on the device, one read per block.
    """
    b, t, device = q.shape[0], k.shape[2], k.device
    state.written = Written()
    # A call of many tokens may step less often than decoding (the schedule's prefill period):
    # the window holds that many waiting tokens during the call, and the schedule's period again
    # after it (its last step leaves fewer waiting).
    prefill = state.prefill_period(t)
    if prefill is not None:
        state.resize_window(prefill)
        state.counts.due = None
    # Packed index of each row's next token, and whether the row's last token stepped (its
    # query then waits for the state after the step).
    offset: int | torch.Tensor = 0 if host else torch.zeros(b, dtype=torch.long, device=device)
    carried: int | torch.Tensor = 0 if host else torch.zeros(b, dtype=torch.long, device=device)
    remaining = None if host else valid.sum(dim=1)
    while (offset < t) if host else bool((remaining > 0).any()):
        if host:
            if prefill is None:
                dues = state.counts.host_due(state.schedule)
            else:
                dues = ask_prefill(state.schedule, torch.tensor(state.counts.host_seen(), dtype=torch.long), torch.full((b,), t - offset, dtype=torch.long))
                dues = dues.tolist()
                check_until(state.schedule, min(dues), max(dues), prefill)
            L = min(min(dues), t - offset)
            steps = [d == L for d in dues]
            length, any_step = L, any(steps)
            stepping = (torch.full((b,), True, device=device) if all(steps) else torch.tensor(steps, device=device)) if any_step else None
            pos = state.seen[:, None] if L == 1 else (state.seen[:, None] + torch.arange(L, device=device)).expand(b, L)
            active = None
            k_c, v_c = k.narrow(2, offset, L), v.narrow(2, offset, L)
        else:
            due = ask_schedule(state.schedule, state.seen) if prefill is None else ask_prefill(state.schedule, state.seen, remaining)
            length = torch.minimum(due, remaining)
            stepping = (length == due) & (length > 0)
            # One device read for the block's length, whether a step falls in it and the
            # schedule's range (an answer of 0 would make empty blocks forever).
            L, any_step, lo, hi = torch.stack([length.max(), stepping.any().long(), due.min(), due.max()]).tolist()
            check_until(state.schedule, lo, hi, prefill)
            L, any_step = int(L), bool(any_step)
            j = torch.arange(L, device=device)
            active = j[None, :] < length[:, None]  # [B, L]
            idx = (offset[:, None] + j).clamp(max=t - 1)
            pos = torch.where(active, state.seen[:, None] + j, -1)
            k_c, v_c = gather_tokens(k, idx), gather_tokens(v, idx)

        q_c = (q.narrow(2, offset, L) if host else gather_tokens(q, idx)) if state.queries is not None else None
        write_block(state, k_c, v_c, pos, length, q_c, active)
        if host and prefill is None:  # the countdowns go on without asking the schedule, which is asked at a step
            state.counts.due = [d - L for d in dues] if not any_step else state.counts.host_due(state.schedule)
        # The carried query and this block's queries up to (not including) a stepping one.
        stepped = int(any_step) if host else stepping.long()
        reads.add(offset - carried, carried + length - stepped)
        if any_step:
            step(state, stepping, feature_map_k, scale)
        offset, carried = offset + length, stepped
        if not host:
            remaining = remaining - length
    reads.add(offset - carried, carried)  # a step on the last token: its query reads the state after it
    if prefill is not None:
        state.counts.due = None  # asked of the schedule again at the next call
        state.resize_window(state.schedule.period)
    if state.binding is not None:
        if isinstance(reads, SegmentReads):
            reads.flush()  # a waiting read may hold the pages themselves: read before they change
        sync(state, state.written.pushed if state.written.ring_only else None)


def write_block(
    state: LayerState,
    k: torch.Tensor,
    v: torch.Tensor,
    pos: torch.Tensor,
    length: int | torch.Tensor,
    q: torch.Tensor | None,
    active: torch.Tensor | None = None,
) -> None:
    """Take in a block of tokens, the one write of prefill and decode alike: sinks take the
    positions below their capacity, the window the rest (one token per row past the sinks
    goes into its ring slot in place), each row's count advances by ``length``, and the
    query statistics (if any) see the block's queries.

    Args:
        k, v: ``[B, Hs, L, D]``; pos: ``[B, L]`` int64 positions, ``-1`` for entries that are
            not tokens (padding).
        length: tokens per row, an int when every row takes ``L``, else ``[B]``.
        q: ``[B, H, L, D]`` the block's queries (for the statistics), or ``None``.
        active: ``[B, L]`` bool real entries, ``None`` when all are.
    """
    lo, hi = state.counts.host_range()
    past_sinks = lo >= state.sinks.capacity  # every row is past its sinks: none takes a token
    if past_sinks and k.shape[2] == 1 and active is None and hasattr(state.window, "push"):
        # Decode: rows in step write one ring slot known on the host, the others their own.
        state.window.push(k, v, pos, lo % state.window.capacity if lo == hi else state.seen)
        state.written.pushed = pos[:, 0]  # (two pushes in one call have a step between them: whole rows sync)
    elif past_sinks:
        state.window.append(k, v, pos)
        state.written.ring_only = False
    else:
        taken = state.sinks.write(k, v, pos)
        state.window.append(k, v, torch.where(taken, -1, pos))
        state.written.ring_only = False
    state.counts.advance(length)
    if state.queries is not None and q is not None:
        state.written.ring_only = False
        state.queries.update(q, active if active is not None else torch.ones(pos.shape, dtype=torch.bool, device=pos.device))
