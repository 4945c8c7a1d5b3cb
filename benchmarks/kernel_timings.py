#!/usr/bin/env python
"""Benchmark the lola kernels: Triton vs the PyTorch reference (and fla for op 1).

    python benchmarks/kernel_timings.py [--quick] [--ops chunk_linear_attention decode_step ...]
                                 [--dtype bf16] [--output results.md]

Times each op over a grid of sizes (CUDA events on GPU, perf_counter on CPU; warmup,
then the median of the repeats) and prints one Markdown table: time, tokens/s, achieved
GB/s (compulsory traffic: inputs read once, outputs written once), TFLOP/s (the chunked /
tiled algorithm's useful flops) and the speed-up over the reference timed in the same
process. On a CPU only the reference is timed (Triton would run in its interpreter).
"""

from __future__ import annotations

import argparse
import importlib
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Dict, List

import torch

# bench_common (this folder) holds the peak-bandwidth table and the fla wrapper shared with
# benchmarks/layer.py; importing it puts src/ on the path when lola is not installed.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import DTYPES, PEAK_GBPS, add_timing_args, apply_threads, fla_chunk_linear_attn, peak_gbps  # noqa: E402, F401

import lola.kernels  # noqa: E402
from lola.kernels.dispatch import PACKAGE_OF_OP  # noqa: E402

OPS = ("chunk_linear_attention", "softmax_partial", "self_recall_error", "decode_step")


@dataclass
class Case:
    op: str
    label: str
    args: dict
    tokens: int  # tokens processed per call
    nbytes: float  # compulsory bytes per call
    flops: float  # useful flops per call


def _impl(op: str, name: str) -> Callable:
    return getattr(importlib.import_module(f"lola.kernels.{PACKAGE_OF_OP[op]}.{name}"), op)


# ------------------------------------------------------------------------------ cases


def chunk_case(B, T, H, F, D, dtype, device) -> Case:
    g = dict(dtype=dtype, device=device)
    it = torch.finfo(dtype).bits // 8
    args = dict(fq=torch.rand(B, T, H, F, **g) / F, fk=torch.rand(B, T, H, F, **g), v=torch.randn(B, T, H, D, **g))
    C = 64
    flops = B * T * H * (4 * F * D + 2 * C * (F + D))  # q.h + k^T v, intra-chunk qk^T and Av
    nbytes = B * T * H * ((2 * F + D) * it + (D + 1) * 4)
    return Case("chunk_linear_attention", f"B={B} T={T} H={H} F={F} D={D}", args, B * T, nbytes, flops)


def softmax_case(B, H, Hs, L, N, D, dtype, device) -> Case:
    g = dict(dtype=dtype, device=device)
    it = torch.finfo(dtype).bits // 8
    args = dict(
        q=torch.randn(B, H, L, D, **g),
        k=torch.randn(B, Hs, N, D, **g),
        v=torch.randn(B, Hs, N, D, **g),
        q_pos=(N - L + torch.arange(L, device=device)).expand(B, L).contiguous(),
        k_pos=torch.arange(N, device=device).expand(B, Hs, N).contiguous(),
        scale=D**-0.5,
    )
    nbytes = (B * H * L * D + 2 * B * Hs * N * D) * it + 8 * (B * L + B * Hs * N) + 4 * B * H * L * (D + 2)
    return Case("softmax_partial", f"B={B} H={H} Hs={Hs} L={L} N={N} D={D}", args, B * L, nbytes, 4.0 * B * H * L * N * D)


def sre_case(B, H, N, F, D, dtype, device) -> Case:
    g = dict(dtype=dtype, device=device)
    it = torch.finfo(dtype).bits // 8
    f32 = dict(dtype=torch.float32, device=device)
    args = dict(fk=torch.rand(B, H, N, F, **g), v=torch.randn(B, H, N, D, **g), H=torch.randn(B, H, F, D, **f32), s=torch.rand(B, H, F, **f32) + 1)
    nbytes = B * H * N * (F + D) * it + 4 * B * H * (F * D + F + N)
    return Case("self_recall_error", f"B={B} H={H} N={N} F={F} D={D}", args, B * N, nbytes, 2.0 * B * H * N * F * D)


def decode_case(B, H, Hs, N, D, F, dtype, device, mixing="lola_authors") -> Case:
    g = dict(dtype=dtype, device=device)
    it = torch.finfo(dtype).bits // 8
    f32 = dict(dtype=torch.float32, device=device)
    args = dict(
        q=torch.randn(B, H, D, **g),
        k=torch.randn(B, Hs, N, D, **g),
        v=torch.randn(B, Hs, N, D, **g),
        k_pos=torch.arange(N, device=device).expand(B, Hs, N).contiguous(),
        fq=torch.rand(B, H, F, **g) / F,
        H=torch.randn(B, H, F, D, **f32),
        s=torch.rand(B, H, F, **f32) + 1,
        gate=torch.rand(H, **f32),
        mixing=mixing,
        scale=D**-0.5,
    )
    nbytes = (B * H * (D + F) + 2 * B * Hs * N * D) * it + 8 * B * Hs * N + 4 * B * H * (F * D + F + D) + 4 * H
    flops = 4.0 * B * H * N * D + 2.0 * B * H * F * D
    return Case("decode_step", f"B={B} H={H} Hs={Hs} N={N} D={D} F={F} {mixing}", args, B, nbytes, flops)


# The grids, a case a row: its builder and its sizes (the builder's arguments before dtype and
# device). On a CPU the quick grid (< 1 minute on a small CPU) and the full one share no case; on
# a GPU the quick grid is the full one's rows marked True, so each GPU case is written once.
CPU_QUICK_GRID = [
    (chunk_case, (1, 1024, 4, 64, 64)),
    (softmax_case, (1, 4, 2, 128, 512, 64)),
    (sre_case, (1, 4, 1024, 64, 64)),
    (decode_case, (8, 8, 2, 512, 64, 64)),
]
CPU_GRID = [
    (chunk_case, (1, 4096, 8, 64, 64)),
    (chunk_case, (1, 2048, 8, 128, 128)),
    (softmax_case, (1, 8, 2, 512, 1024, 64)),
    (sre_case, (1, 8, 4096, 128, 128)),
    (decode_case, (16, 16, 4, 512, 128, 128)),
]
GPU_GRID = [  # (in the quick grid, builder, sizes)
    (False, chunk_case, (2, 4096, 16, 64, 64)),
    (True, chunk_case, (2, 16384, 16, 64, 64)),
    (True, chunk_case, (2, 16384, 16, 128, 128)),
    (False, chunk_case, (8, 2048, 32, 128, 128)),
    (True, softmax_case, (4, 32, 8, 1024, 1536, 128)),
    (False, softmax_case, (2, 32, 8, 4096, 4096, 128)),
    (False, sre_case, (2, 16, 16384, 64, 64)),
    (True, sre_case, (2, 16, 16384, 128, 128)),
    (True, decode_case, (64, 32, 8, 512, 128, 128)),
    (True, decode_case, (64, 32, 32, 512, 64, 64)),
    (False, partial(decode_case, mixing="softmax_only"), (64, 32, 8, 512, 128, 128)),
    (False, decode_case, (1, 32, 8, 4096, 128, 128)),
]


def grid(quick: bool, on_gpu: bool, dtype, device) -> List[Case]:
    if on_gpu:
        rows = [(build, sizes) for in_quick, build, sizes in GPU_GRID if in_quick or not quick]
    else:
        rows = CPU_QUICK_GRID if quick else CPU_GRID
    return [build(*sizes, dtype, device) for build, sizes in rows]


# ------------------------------------------------------------------------------ timing


def measure(fn: Callable, args: dict, device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds per call."""
    for _ in range(warmup):
        fn(**args)
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(**args)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(**args)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a tiny grid (under a minute on CPU)")
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_timing_args(p)
    args = p.parse_args(argv)
    apply_threads(args)
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    dtype = DTYPES[args.dtype]
    warmup = args.warmup if args.warmup is not None else (5 if on_gpu else 1)
    repeats = args.repeats if args.repeats is not None else (20 if on_gpu else 3)
    peak = peak_gbps(device, args.peak_gbps)
    torch.manual_seed(0)

    impls: Dict[str, Dict[str, Callable]] = {op: {"reference": _impl(op, "reference")} for op in OPS}
    notes = []
    if on_gpu and lola.kernels.triton_available():
        for op in OPS:
            impls[op]["triton"] = _impl(op, "triton")
        fla = fla_chunk_linear_attn()
        if fla is not None:
            impls["chunk_linear_attention"]["fla"] = fla
        else:
            notes.append("fla not importable: no fla baseline.")
    elif on_gpu:
        notes.append("triton not importable: reference only.")
    else:
        notes.append("CPU run: only the PyTorch reference is timed (Triton runs only in its interpreter here).")

    dev_name = torch.cuda.get_device_name(device) if on_gpu else f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads"
    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = "-"
    lines = [
        f"## lola kernels benchmark ({'quick' if args.quick else 'full'} grid)",
        "",
        f"device: {device.type} ({dev_name}), torch {torch.__version__}, triton {triton_version}, "
        f"inputs {args.dtype}, median of {repeats} after {warmup} warmup" + (f", peak bandwidth {peak:.0f} GB/s" if peak else ""),
        "",
    ]
    lines += [f"> {n}" for n in notes] + ([""] if notes else [])
    lines += [
        "| op | shape | impl | ms | tokens/s | GB/s | %peak BW | TFLOP/s | vs reference |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    summary = []
    print("\n".join(lines), flush=True)
    for case in grid(args.quick, on_gpu, dtype, device):
        if case.op not in args.ops:
            continue
        seconds: Dict[str, float] = {}
        for name, fn in impls[case.op].items():
            try:
                seconds[name] = measure(fn, case.args, device, warmup, repeats)
            except torch.cuda.OutOfMemoryError:
                seconds[name] = float("nan")
                torch.cuda.empty_cache()
        ref = seconds.get("reference")
        for name, t in seconds.items():
            if t != t:  # NaN: out of memory
                row = f"| {case.op} | {case.label} | {name} | OOM | | | | | |"
            else:
                gbps = case.nbytes / t / 1e9
                row = (
                    f"| {case.op} | {case.label} | {name} | {t * 1e3:.3f} | {case.tokens / t:,.0f} | {gbps:,.2f} | "
                    f"{f'{100 * gbps / peak:.0f}%' if peak else '-'} | {case.flops / t / 1e12:.3f} | "
                    f"{f'{ref / t:.2f}x' if ref and ref == ref else '-'} |"
                )
            lines.append(row)
            print(row, flush=True)
        if "fla" in seconds and "triton" in seconds:
            summary.append(f"- {case.op} {case.label}: triton / fla throughput = {seconds['fla'] / seconds['triton']:.2f}x")
        if case.op == "decode_step" and "triton" in seconds and peak:
            summary.append(f"- decode_step {case.label}: triton at {100 * case.nbytes / seconds['triton'] / 1e9 / peak:.0f}% of peak bandwidth")
    if summary:
        lines += ["", *summary]
        print("\n" + "\n".join(summary))
    if args.output:
        with open(args.output, "a") as f:
            f.write("\n".join(lines) + "\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
