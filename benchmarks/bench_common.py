"""Helpers shared by the benchmark scripts (not a benchmark itself).

The scripts are run as ``python benchmarks/<name>.py``, so this module is imported as
``bench_common`` (each script puts its own folder on ``sys.path`` first).
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path
from typing import Callable, Optional

import torch

try:
    import lola  # noqa: F401
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# Peak HBM bandwidth (GB/s, datasheet), matched against torch.cuda.get_device_name in this order.
PEAK_GBPS = {
    "H200": 4800.0,
    "H100 SXM": 3350.0,
    "H100 80GB HBM3": 3350.0,
    "H100 PCIe": 2000.0,
    "H100": 3350.0,
    "A100-SXM4-80GB": 2039.0,
    "A100": 1555.0,
    "L40S": 864.0,
    "4090": 1008.0,
}


def peak_gbps(device: torch.device, override: Optional[float] = None) -> Optional[float]:
    """The device's peak memory bandwidth in GB/s: ``override`` if given, else looked up by
    CUDA device name in :data:`PEAK_GBPS`; ``None`` on CPU or for an unknown GPU."""
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_GBPS.items():
        if key in name:
            return value
    return None


def fla_chunk_linear_attn() -> Optional[Callable]:
    """flash-linear-attention's ``chunk_linear_attn`` as ``run(fq, fk, v)`` computing the same
    unnormalised, unscaled numerator as :func:`lola.kernels.chunk_linear_attention` (inputs
    ``[B, T, H, F|D]``), or ``None`` when ``fla`` does not import."""
    try:
        from fla.ops.linear_attn import chunk_linear_attn
    except Exception:
        return None

    def run(fq, fk, v, initial_state=None, output_final_state=False):
        try:  # unnormalised, unscaled: the same quantity as our num
            return chunk_linear_attn(fq, fk, v, scale=1.0, normalize=False)
        except TypeError:  # older fla without `normalize`
            return chunk_linear_attn(fq, fk, v, scale=1.0)

    return run


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def describe_device(device: torch.device) -> str:
    """``"NVIDIA H200"`` or ``"x86_64, 2 torch threads"``."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads"


def triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except Exception:
        return "-"


def add_timing_args(parser: argparse.ArgumentParser) -> None:
    """The options every timing script shares: warm-up, repeats, peak bandwidth, threads, output."""
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--peak-gbps", type=float, default=None, help="memory bandwidth for the %%peak column (default: looked up by GPU name)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--output", default=None, help="also append the Markdown report to this file")


def apply_threads(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)


def noise_ids(tok, tokens: int) -> torch.Tensor:
    """``[1, tokens]`` ids of ``lola niah``'s noise haystack (the benchmarks' text)."""
    from lola.eval.niah import NOISE

    return tok("\n".join([NOISE] * (tokens // 10 + 100)), return_tensors="pt").input_ids[:, :tokens]


def niah_lola_config(model: str, feature_maps: str, policy: str, tokens: int):
    """``(method name, LoLAConfig)`` of the LoLA method ``lola niah`` runs on ``model`` with
    ``feature_maps`` and ``policy`` at ``tokens`` (its defaults: the paper's rule, calibrated
    budgets, the maps' read defaults)."""
    from lola.eval.niah_spec import NiahRun, method_configs

    run = NiahRun(model=model, feature_maps=feature_maps, methods=["lola"], policies=[policy], lengths=[tokens], samples=1)
    ((method, cfg),) = method_configs(run).items()
    return method, cfg
