"""The whole LoLA layer on a GPU: Triton kernels against the PyTorch reference, and its speed.

    python benchmarks/gpu_layer_check.py [--context 4096] [--decode 64] [--dtype bf16]

Runs one LoLA attention layer (SmolLM2-like shapes: H=9, H_kv=3, D=64; window 64, sparse 64,
sinks 4, chunk 64, SRE) over a prefill of ``--context`` tokens in 1024-token segments and then
``--decode`` single-token steps, once with ``LOLA_KERNELS=reference`` and once with ``triton``,
from the same inputs. Prints the largest output difference (the two must agree) and the
prefill / per-token decode times of both, as a ratio measured in the same process.
"""

from __future__ import annotations

import argparse
import time

import torch

import lola
from lola.kernels import use_backend


def run(layer: lola.LoLAAttention, q, k, v, context: int, segment: int) -> tuple[torch.Tensor, float, float]:
    """Outputs ``[B, T, H, D]``, prefill seconds, decode seconds per token."""
    outs, state = [], None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for start in range(0, context, segment):
        o, state = layer(q[:, start : start + segment], k[:, start : start + segment], v[:, start : start + segment], state)
        outs.append(o)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    for t in range(context, q.shape[1]):
        o, state = layer(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], state)
        outs.append(o)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    decode = max(q.shape[1] - context, 1)
    return torch.cat(outs, dim=1), t1 - t0, (t2 - t1) / decode


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this check needs a GPU")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.manual_seed(0)
    cfg = lola.LoLAConfig(window=64, sparse_size=64, sinks=4, chunk=64, policy="sre")
    layer = lola.compose(cfg, num_heads=9, head_dim=64, num_kv_heads=3).cuda()
    T = args.context + args.decode
    g = dict(device="cuda", dtype=dtype)
    q, k, v = torch.randn(args.batch, T, 9, 64, **g), torch.randn(args.batch, T, 3, 64, **g), torch.randn(args.batch, T, 3, 64, **g)
    results = {}
    with torch.no_grad():
        for name in ("reference", "triton", "reference", "triton"):  # second round: warm (compiled)
            with use_backend(name):
                results[name] = run(layer, q, k, v, args.context, 1024)
    ref, tri = results["reference"], results["triton"]
    diff = (ref[0].float() - tri[0].float()).abs()
    scale = ref[0].float().abs().max().item()
    print(f"context {args.context}, decode {args.decode}, batch {args.batch}, {args.dtype}")
    print(f"max |triton - reference| = {diff.max().item():.3e} (max |reference| = {scale:.3e}); mean = {diff.mean().item():.3e}")
    print(f"prefill: reference {ref[1] * 1e3:.1f} ms, triton {tri[1] * 1e3:.1f} ms, ratio {ref[1] / tri[1]:.2f}x")
    print(f"decode: reference {ref[2] * 1e3:.2f} ms/token, triton {tri[2] * 1e3:.2f} ms/token, ratio {ref[2] / tri[2]:.2f}x")
    tol = 5e-2 if dtype == torch.bfloat16 else 1e-3
    ok = bool(diff.max().item() <= tol * max(scale, 1.0))
    print("AGREE" if ok else f"DISAGREE (tolerance {tol} x max(1, max|reference|))")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
