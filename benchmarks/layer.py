#!/usr/bin/env python
"""One whole LoLA layer against stock attention: the decode step and the prefill, one process.

    python benchmarks/layer.py [--quick] [--device cpu|cuda] [--dtype fp32|fp16|bf16]
                               [--shape smollm2 llama8b H,HKV,D ...] [--mixing softmax_only ...]
                               [--check-inputs on|off|both] [--batch B] [--context N]
                               [--prefill T] [--output report.md]

The layer is ``lola.compose(lola.LoLAConfig(window=64, sparse_size=64, sinks=4, chunk=64,
policy="sre"), num_heads=H, head_dim=D, num_kv_heads=H_kv)`` (``--mixing`` and
``--check-inputs`` vary the two fields that change what a step does; the defaults are the
config's). Shapes: ``smollm2`` (SmolLM2-135M: H=9, H_kv=3, D=64, the default) and ``llama8b``
(H=32, H_kv=8, D=128), or ``H,H_kv,D``. Inputs are random (no model is loaded).

Decode: the layer's state is built by a prefill of ``--context`` tokens for ``--batch`` rows,
then ``chunk`` (64) single-token steps are timed, so one select-and-evict step is in each
run; every run starts from the same snapshot of the state. Reported: the mean time per step
(the runs' median of wall time over the 64 steps, synchronised at both ends) and the median
single step; the bytes the step must read (the exact slots' K/V and positions, the linear
state ``H, s`` when the mixing reads it, the new token's q/k/v and features, the output) and
the GB/s that makes at the mean time, and on CUDA the fraction of the device's peak HBM
bandwidth. Baselines, same rows and context: ``torch.nn.functional.scaled_dot_product_attention``
over a K/V cache that grows by one token per step, (a) by ``torch.cat`` as transformers'
``DynamicCache`` does, (b) written in place into a preallocated cache and attended up to the
current length (a sliced static cache).

Prefill: tokens/s of the layer on one ``--prefill``-token call (a fresh state) against causal
SDPA on the same q/k/v, and against flash-linear-attention's ``chunk_linear_attn`` (only when
``fla`` imports) and lola's own ``chunk_linear_attention`` on the layer's features
``φ(q), φ(k)`` (F = 2D) and v, with the heads expanded to H. Those two time the linear
attention alone, which the layer does not call at prefill (its linear state is read per
64-token block); they say what a prefill built on the chunked kernel could reach.

Timings are medians after warm-up, synchronised on CUDA; every ratio compares figures taken
in this process. Nothing is asserted: machines are noisy. ``lola.kernels.record_calls()``
shows which kernel backend each timed LoLA run dispatched to (Triton on CUDA, else the
PyTorch reference).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import DTYPES, add_timing_args, apply_threads, describe_device, fla_chunk_linear_attn, peak_gbps, sync, triton_version  # noqa: E402

import lola  # noqa: E402
from lola.kernels import chunk_linear_attention, record_calls  # noqa: E402

SHAPES = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}
MIXINGS = ("softmax_only", "lola_authors", "lolcats")
BASE = dict(window=64, sparse_size=64, sinks=4, chunk=64, policy="sre")


@dataclass
class Shape:
    name: str
    heads: int
    kv_heads: int
    head_dim: int

    def __str__(self) -> str:
        return f"{self.name} (H={self.heads}, H_kv={self.kv_heads}, D={self.head_dim})"


def parse_shape(text: str) -> Shape:
    if text in SHAPES:
        return Shape(text, *SHAPES[text])
    try:
        h, hkv, d = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is one of {', '.join(SHAPES)} or H,H_KV,D; got {text!r}") from None
    return Shape(text, h, hkv, d)


def build_layer(shape: Shape, mixing: str, check_inputs: bool, device: torch.device) -> lola.LoLAAttention:
    cfg = lola.LoLAConfig(**BASE, mixing=mixing, check_inputs=check_inputs)
    layer = lola.compose(cfg, num_heads=shape.heads, head_dim=shape.head_dim, num_kv_heads=shape.kv_heads)
    return layer.to(device).eval()


def calls(counter) -> str:
    """``decode_step[triton] x64, self_recall_error[triton] x1``."""
    return ", ".join(f"{op}[{impl}] x{n}" for (op, impl), n in sorted(counter.items())) or "no lola kernel"


# ------------------------------------------------------------------------------ timing


def time_calls(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median wall seconds of ``fn()``, synchronised before and after each call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_steps(reset: Callable[[], None], step: Callable[[int], None], steps: int, device: torch.device, warmup: int, repeats: int) -> tuple[float, float]:
    """Run ``reset()`` (untimed) then ``step(0..steps-1)``, ``warmup + repeats`` times.

    Returns ``(mean, median)`` seconds per step: the median over the timed runs of their wall
    time / ``steps`` (synchronised at both ends, so queued device work is counted), and the
    median single step over all timed steps (CUDA events between steps on a GPU).
    """
    means: List[float] = []
    singles: List[float] = []
    cuda = device.type == "cuda"
    for r in range(warmup + repeats):
        reset()
        sync(device)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)] if cuda else None
        marks = [time.perf_counter()]
        if cuda:
            events[0].record()
        for i in range(steps):
            step(i)
            if cuda:
                events[i + 1].record()
            else:
                marks.append(time.perf_counter())
        sync(device)
        wall = time.perf_counter() - marks[0]
        if r < warmup:
            continue
        means.append(wall / steps)
        if cuda:
            singles += [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(steps)]
        else:
            singles += [b - a for a, b in zip(marks, marks[1:])]
    return statistics.median(means), statistics.median(singles)


# ------------------------------------------------------------------------------ SDPA (stock)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """``q [B, H, T, D]``, ``k, v [B, H_kv, N, D]``: SDPA with grouped heads (transformers' path
    on torch >= 2.5), repeating K/V heads where ``enable_gqa`` is missing."""
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    except torch.cuda.OutOfMemoryError:
        raise
    except (TypeError, RuntimeError):  # no enable_gqa, or no kernel for it on this build
        g = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=causal)


# ------------------------------------------------------------------------------ decode


def bench_decode(shape: Shape, variants, args, device, dtype, peak) -> List[str]:
    """The decode section's Markdown lines."""
    B, N, P = args.batch, args.context, BASE["chunk"]
    H, Hkv, D = shape.heads, shape.kv_heads, shape.head_dim
    it = torch.finfo(dtype).bits // 8
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*size):
        return torch.randn(*size, generator=gen, device=device, dtype=dtype)

    # The new tokens, the same for every implementation: [B, 1, heads, D] (the layer's layout).
    toks = [(rand(B, 1, H, D), rand(B, 1, Hkv, D), rand(B, 1, Hkv, D)) for _ in range(P)]
    notes: List[str] = []
    rows = []  # (name, mean s, median s, bytes, counter or None)

    # LoLA: one state built by a segmented prefill, snapshotted; each variant decodes from it.
    layers = {var: build_layer(shape, *var, device) for var in variants}
    layer0 = next(iter(layers.values()))
    seg = max(BASE["chunk"], min(N, (65536 // B) // BASE["chunk"] * BASE["chunk"]))
    state = None
    t0 = time.perf_counter()
    for start in range(0, N, seg):
        n = min(seg, N - start)
        _, state = layer0(rand(B, n, H, D), rand(B, n, Hkv, D), rand(B, n, Hkv, D), state=state)
    sync(device)
    build_s = time.perf_counter() - t0
    snap = {name: t.clone() for name, t in state.state_dict().items()}
    slot_bytes = sum(t.numel() * t.element_size() for m in state.exact_memories if m.capacity for t in (m.block.k, m.block.v, m.block.pos))
    slots = sum(m.block.pos.shape[-1] for m in state.exact_memories if m.capacity)
    H_, s_ = state.linear.state
    linear_bytes = H_.numel() * 4 + s_.numel() * 4
    F_ = layer0.feature_dim
    notes.append(
        f"decode state after {N:,} tokens x {B} rows (built in {build_s:.1f} s, segments of {seg}): {slots} exact slots per storage head "
        f"({slot_bytes / 1e6:.2f} MB with positions), linear H,s {linear_bytes / 1e6:.2f} MB (F={F_}); state.nbytes() = {state.nbytes() / 1e6:.2f} MB"
    )

    for (mixing, check), layer in layers.items():
        # Each variant reads the state with layer0's weights (its features summed it) and owns it while timed.
        layer.load_state_dict(layer0.state_dict())
        layer.take(state)
        reads_linear = mixing != "softmax_only"
        token_bytes = B * H * D * it + 2 * B * Hkv * D * it + B * H * D * 4 + (B * H * F_ * 4 if reads_linear else 0)
        nbytes = slot_bytes + (linear_bytes if reads_linear else 0) + token_bytes

        def reset():
            state.load_state_dict(snap)

        def step(i, layer=layer):
            layer(*toks[i], state=state)

        with record_calls() as counter:
            mean, med = time_steps(reset, step, P, device, args.warmup, args.repeats)
        rows.append((f"lola {mixing}, check_inputs={'on' if check else 'off'}", mean, med, nbytes, counter))

    state = snap = layers = None  # free the LoLA state before the caches are allocated
    if device.type == "cuda":
        torch.cuda.empty_cache()

    # SDPA over a K/V cache of N tokens; q [B, H, 1, D], k/v [B, H_kv, 1, D].
    sq = [(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)) for q, k, v in toks]
    k0, v0 = rand(B, Hkv, N, D), rand(B, Hkv, N, D)
    avg_n = N + (P + 1) / 2  # keys read per step, on average over the run
    sdpa_bytes = int(2 * B * Hkv * avg_n * D * it + 2 * B * H * D * it + 2 * B * Hkv * D * it)
    cache = {}

    def reset_cat():
        cache["k"], cache["v"] = k0, v0

    def step_cat(i):  # DynamicCache.update: torch.cat along the sequence axis
        q, k, v = sq[i]
        cache["k"] = torch.cat([cache["k"], k], dim=2)
        cache["v"] = torch.cat([cache["v"], v], dim=2)
        sdpa(q, cache["k"], cache["v"], causal=False)

    try:
        mean, med = time_steps(reset_cat, step_cat, P, device, args.warmup, args.repeats)
        rows.append(("sdpa + torch.cat cache (DynamicCache)", mean, med, sdpa_bytes, None))
    except torch.cuda.OutOfMemoryError:
        notes.append("sdpa + torch.cat cache: out of memory")
    cache.clear()
    if device.type == "cuda":
        torch.cuda.empty_cache()

    try:
        kbuf, vbuf = torch.empty(B, Hkv, N + P, D, device=device, dtype=dtype), torch.empty(B, Hkv, N + P, D, device=device, dtype=dtype)
        kbuf[:, :, :N], vbuf[:, :, :N] = k0, v0

        def step_static(i):  # written in place (index_copy_-like), attended up to the current length
            q, k, v = sq[i]
            kbuf[:, :, N + i : N + i + 1].copy_(k)
            vbuf[:, :, N + i : N + i + 1].copy_(v)
            sdpa(q, kbuf[:, :, : N + i + 1], vbuf[:, :, : N + i + 1], causal=False)

        mean, med = time_steps(lambda: None, step_static, P, device, args.warmup, args.repeats)
        rows.append(("sdpa + preallocated cache (sliced static)", mean, med, sdpa_bytes, None))
    except torch.cuda.OutOfMemoryError:
        notes.append("sdpa + preallocated cache: out of memory")

    notes.append(
        "MB read/step counts the compulsory traffic only (each input read once, the output written once): "
        "copies the engine or the cache makes on the way (DynamicCache's torch.cat rewrites the whole cache) are not in it"
    )
    ref = next((r[1] for r in rows if r[0].startswith("sdpa + torch.cat")), None)
    lines = [
        f"### Decode: {shape}, batch {B}, context {N:,}, {P} steps per run",
        "",
        *[f"> {n}" for n in notes],
        "",
        "| implementation | ms/step (mean) | ms/step (median) | MB read/step | GB/s | %peak BW | tokens/s | speed vs sdpa+cat |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    kernel_lines = []
    for name, mean, med, nbytes, counter in rows:
        gbps = nbytes / mean / 1e9
        lines.append(
            f"| {name} | {mean * 1e3:.3f} | {med * 1e3:.3f} | {nbytes / 1e6:.2f} | {gbps:,.1f} | "
            f"{f'{100 * gbps / peak:.1f}%' if peak else '-'} | {B / mean:,.0f} | {f'{ref / mean:.2f}x' if ref else '-'} |"
        )
        if counter is not None:
            kernel_lines.append(f"- {name}: {calls(counter)} over {(args.warmup + args.repeats) * P} steps")
    lines += ["", "Kernels dispatched by the LoLA decode runs (warm-up included):", *kernel_lines, ""]
    return lines


# ------------------------------------------------------------------------------ prefill


def bench_prefill(shape: Shape, variants, args, device, dtype) -> List[str]:
    """The prefill section's Markdown lines."""
    B, T = args.prefill_batch, args.prefill
    H, Hkv, D = shape.heads, shape.kv_heads, shape.head_dim
    gen = torch.Generator(device=device).manual_seed(1)
    q, k, v = (torch.randn(B, T, h, D, generator=gen, device=device, dtype=dtype) for h in (H, Hkv, Hkv))
    notes: List[str] = []
    rows = []  # (name, seconds, counter or None)
    # check_inputs costs one validation per call, nothing at this size: one per mixing rule.
    for var in dict.fromkeys((m, variants[0][1]) for m, _ in variants):
        layer = build_layer(shape, *var, device)
        with record_calls() as counter:
            t = time_calls(lambda layer=layer: layer(q, k, v), device, args.warmup, args.repeats)
        rows.append((f"lola layer {var[0]}, check_inputs={'on' if var[1] else 'off'}", t, counter))

    qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    try:
        rows.append(("sdpa causal", time_calls(lambda: sdpa(qh, kh, vh, causal=True), device, args.warmup, args.repeats), None))
    except torch.cuda.OutOfMemoryError:
        notes.append("sdpa causal prefill: out of memory")

    # The layer's own features, heads expanded to H (the feature maps are per query head).
    layer = build_layer(shape, *variants[0], device)
    g = H // Hkv
    with torch.inference_mode():
        fq = layer.feature_map_q(q.transpose(1, 2)).transpose(1, 2).to(dtype).contiguous()
        fk = layer.feature_map_k(k.repeat_interleave(g, dim=2).transpose(1, 2)).transpose(1, 2).to(dtype).contiguous()
    ve = v.repeat_interleave(g, dim=2).contiguous()
    Fdim = fq.shape[-1]
    with record_calls() as counter:
        t_lola = time_calls(lambda: chunk_linear_attention(fq, fk, ve), device, args.warmup, args.repeats)
    rows.append((f"lola chunk_linear_attention (F={Fdim})", t_lola, counter))
    fla = fla_chunk_linear_attn() if device.type == "cuda" else None
    t_fla = None
    if device.type != "cuda":
        notes.append("fla's kernels run on CUDA only: no chunk_linear_attn baseline here.")
    elif fla is None:
        notes.append("fla not importable: no chunk_linear_attn baseline.")
    else:
        try:
            t_fla = time_calls(lambda: fla(fq, fk, ve), device, args.warmup, args.repeats)
            rows.append((f"fla chunk_linear_attn (F={Fdim})", t_fla, None))
        except Exception as e:  # an fla build that refuses the shape or dtype
            notes.append(f"fla chunk_linear_attn failed at F={Fdim}, D={D}, {dtype}: {type(e).__name__}: {str(e)[:200]}")

    t_sdpa = next((t for name, t, _ in rows if name == "sdpa causal"), None)
    lines = [
        f"### Prefill: {shape}, batch {B}, {T:,} tokens in one call",
        "",
        *[f"> {n}" for n in notes],
        *([""] if notes else []),
        "| implementation | ms | tokens/s | vs sdpa | vs fla |",
        "|---|---:|---:|---:|---:|",
    ]
    kernel_lines = []
    for name, t, counter in rows:
        lines.append(f"| {name} | {t * 1e3:.2f} | {B * T / t:,.0f} | {f'{t_sdpa / t:.3f}x' if t_sdpa else '-'} | {f'{t_fla / t:.3f}x' if t_fla else '-'} |")
        if counter is not None:
            kernel_lines.append(f"- {name}: {calls(counter)} over {args.warmup + args.repeats} calls")
    lines += ["", "Kernels dispatched by the LoLA prefill runs (warm-up included):", *kernel_lines, ""]
    if t_fla:
        lines += [f"chunk_linear_attention / fla throughput at F={Fdim}, D={D}: {t_fla / t_lola:.2f}x (target >= 0.8x)", ""]
    return lines


# ------------------------------------------------------------------------------ main


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats and, on CPU, a shorter context (under a minute on a small CPU)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="inputs (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--shape", nargs="+", type=parse_shape, default=None, help=f"{', '.join(SHAPES)} or H,H_KV,D (default: smollm2)")
    p.add_argument("--mixing", nargs="+", choices=MIXINGS, default=None, help="LoLA mixing rules to time (default: the config's, softmax_only)")
    p.add_argument("--check-inputs", choices=("on", "off", "both"), default="on", help="the layer's per-call input validation (default: on, the config's)")
    p.add_argument("--batch", type=int, default=None, help="decode rows (default: 64 on CUDA, 1 on CPU)")
    p.add_argument("--context", type=int, default=None, help="tokens before the decode steps (default: 16384 on CUDA, 1024 on CPU, 512 with --quick)")
    p.add_argument("--prefill", type=int, default=None, help="prefill tokens (default: 16384 on CUDA, 1024 on CPU)")
    p.add_argument("--prefill-batch", type=int, default=1)
    p.add_argument("--skip", choices=("decode", "prefill"), default=None)
    add_timing_args(p)
    args = p.parse_args(argv)
    apply_threads(args)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device visible to torch")
    on_gpu = device.type == "cuda"
    dtype = DTYPES[args.dtype or ("bf16" if on_gpu else "fp32")]
    shapes = args.shape or [parse_shape("smollm2")]
    mixings = args.mixing or [lola.LoLAConfig().mixing]
    checks = {"on": [True], "off": [False], "both": [True, False]}[args.check_inputs]
    variants = list(itertools.product(mixings, checks))
    args.batch = args.batch or (64 if on_gpu else 1)
    args.context = args.context or (16384 if on_gpu else (512 if args.quick else 1024))
    args.prefill = args.prefill or (16384 if on_gpu else 1024)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick or not on_gpu else 2)
    args.repeats = args.repeats if args.repeats is not None else ((2 if args.quick else 3) if not on_gpu else (3 if args.quick else 5))
    peak = peak_gbps(device, args.peak_gbps)
    torch.manual_seed(0)

    lines = [
        f"## LoLA layer benchmark ({'quick' if args.quick else 'full'})",
        "",
        f"device: {device.type} ({describe_device(device)}), torch {torch.__version__}, triton {triton_version()}, "
        f"lola kernels: {lola.kernels.requested_backend()} -> {lola.kernels.backend(torch.empty(0, device=device))}, inputs {str(dtype).replace('torch.', '')}, "
        f"median of {args.repeats} after {args.warmup} warm-up" + (f", peak bandwidth {peak:.0f} GB/s" if peak else ""),
        "",
        f"layer: lola.compose(LoLAConfig({', '.join(f'{k}={v!r}' for k, v in BASE.items())}, mixing=..., check_inputs=...)); "
        "decode GB/s = the bytes the step must read / mean time per step.",
        "",
    ]
    print("\n".join(lines), flush=True)
    failed: List[str] = []
    with torch.inference_mode():
        for shape in shapes:
            for section in ("decode", "prefill"):
                if args.skip == section:
                    continue
                try:
                    if section == "decode":
                        out = bench_decode(shape, variants, args, device, dtype, peak)
                    else:
                        out = bench_prefill(shape, variants, args, device, dtype)
                except torch.cuda.OutOfMemoryError as e:
                    out = [f"### {section.capitalize()}: {shape}: out of memory ({str(e)[:160]})", ""]
                    torch.cuda.empty_cache()
                except Exception as e:  # report it loudly, go on with the other sections
                    traceback.print_exc()
                    out = [f"### {section.capitalize()}: {shape}: FAILED ({type(e).__name__}: {str(e)[:300]})", ""]
                    failed.append(f"{section} {shape.name}")
                lines += out
                print("\n".join(out), flush=True)
    if args.output:
        with open(args.output, "a") as f:
            f.write("\n".join(lines) + "\n\n")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
