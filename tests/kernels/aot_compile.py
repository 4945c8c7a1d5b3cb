"""Compile every Triton kernel ahead of time for an NVIDIA target, no GPU needed.

Catches GPU-only compile errors on CPU-only machines (the interpreter does not run the
real code generator) and reports registers / spills from ptxas. Run as a script::

    python tests/kernels/aot_compile.py [--arch 90] [--filter TEXT] [--quick]

Every autotune config is compiled unless LOLA_AUTOTUNE=0 (then only the default one).

It must run in a process where TRITON_INTERPRET is not 1 (the kernels must be
JITFunctions, not interpreted ones); test_triton_compiles.py runs it in a subprocess.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402


def cases():
    """(name, autotuned-or-jit kernel, arg types, constexprs, default options) per case."""
    from lola.kernels.decoding import triton as dec
    from lola.kernels.exact_attention import triton as sp
    from lola.kernels.linear_attention import triton as cla
    from lola.kernels.recall_error import triton as sre
    from lola.kernels.utils import dot_precision

    for dt in ("bf16", "fp32"):
        prec = dot_precision(torch.float32 if dt == "fp32" else torch.bfloat16)
        # (5, 9) and (16, 8): small sizes that once crashed Triton 3.6's sm_90 pipeline
        for F, D in ((64, 64), (128, 128), (128, 60), (5, 9), (16, 8)):
            yield (
                f"chunk_state {dt} F={F} D={D}",
                cla.chunk_state_fwd_kernel,
                dict(k=f"*{dt}", v=f"*{dt}", h="*fp32", s="*fp32", h0="*fp32", s0="*fp32", ht="*fp32", st="*fp32", T="i32", NT="i32"),
                dict(H=16 if F >= 64 else 3, F=F, D=D, BT=64, USE_INITIAL_STATE=True, STORE_FINAL_STATE=True, PRECISION=prec),
            )
            yield (
                f"chunk_output {dt} F={F} D={D}",
                cla.chunk_output_fwd_kernel,
                dict(q=f"*{dt}", k=f"*{dt}", v=f"*{dt}", h="*fp32", s="*fp32", num="*fp32", den="*fp32", T="i32", NT="i32"),
                dict(H=16, F=F, D=D, BT=64, PRECISION=prec),
            )
        # the ragged run's arguments (read only with HAS_RAGGED)
        ragged = dict(rk=f"*{dt}", rv=f"*{dt}", r_pos="*i64", r_offsets="*i64", S="i32")
        sp_types = dict(q=f"*{dt}", k=f"*{dt}", v=f"*{dt}", q_pos="*i64", k_pos="*i64", num="*fp32", den="*fp32", mx="*fp32", scale="fp32", L="i32", N="i32")
        dec_types = dict(
            q=f"*{dt}", k=f"*{dt}", v=f"*{dt}", k_pos="*i64", fq=f"*{dt}", h="*fp32", s="*fp32", gate="*fp32", cap="*fp32", o="*fp32", scale="fp32", N="i32"
        )
        for D, has_ragged in ((64, False), (128, False), (64, True), (128, True)):
            yield (
                f"softmax_partial {dt} D={D}" + (" ragged" if has_ragged else ""),
                sp.softmax_partial_fwd_kernel,
                sp_types | ragged,
                dict(H=32, G=4, D=D, BL=64, BN=64 if D <= 64 else 32, BD=D, PRECISION=prec, HAS_RAGGED=has_ragged),
                dict(num_warps=4 if D <= 64 else 8, num_stages=2),
            )
        for D in (64, 128):
            yield (
                f"self_recall_error {dt} F=D={D}",
                sre.self_recall_error_fwd_kernel,
                dict(fk=f"*{dt}", v=f"*{dt}", h="*fp32", s="*fp32", err="*fp32", eps="fp32", N="i32"),
                dict(F=D, D=D, BN=64, BF=64 if D <= 64 else 32, BD=D, PRECISION=prec),
                dict(num_warps=4, num_stages=2),
            )
            for mixing in range(4):
                for has_ragged in (False, True):
                    for has_cap in (False, True) if mixing != 3 else (False,):
                        yield (
                            f"decode_step {dt} D=F={D} mixing={mixing}" + (" ragged" if has_ragged else "") + (" capped" if has_cap else ""),
                            dec.decode_step_fwd_kernel,
                            dec_types | ragged,
                            dict(
                                Hs=8,
                                G=4,
                                D=D,
                                F=D,
                                BG=16,
                                BD=D,
                                BF=64 if D <= 64 else 32,
                                MIXING=mixing,
                                PRECISION=prec,
                                HAS_RAGGED=has_ragged,
                                HAS_CAP=has_cap,
                            ),
                        )


# One case per kernel and code path: what the CPU test suite compiles.
QUICK = (
    "chunk_state bf16 F=128 D=60",
    "chunk_output bf16 F=128 D=128",
    "chunk_output fp32 F=64 D=64",
    "softmax_partial bf16 D=128",
    "softmax_partial fp32 D=64 ragged",
    "self_recall_error fp32 F=D=64",
    "decode_step bf16 D=F=128 mixing=2",
    "decode_step bf16 D=F=64 mixing=3",
    "decode_step bf16 D=F=128 mixing=2 ragged",
    "decode_step bf16 D=F=128 mixing=2 ragged capped",
)


def ptxas_usage(cubin: bytes, arch: int) -> str:
    """Registers / stack (spills) / static shared memory, read with the bundled cuobjdump."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+)", out)
    return f"regs={m.group(1)} stack={m.group(2)} smem={m.group(3)}" if m else out.strip()[:200]


def compile_case(kernel, types, consts, options, arch):
    fn = kernel.fn if hasattr(kernel, "configs") else kernel  # unwrap @triton.autotune
    configs = [None]
    if hasattr(kernel, "configs"):
        configs = kernel.configs
    results = []
    for cfg in configs:
        c = dict(consts)
        opts = dict(options or {})
        if cfg is not None:
            c.update(cfg.kwargs)
            opts.update(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        sig = {a: ("constexpr" if a in c else types[a]) for a in fn.arg_names}
        k = triton.compile(ASTSource(fn, sig, constexprs=c), target=GPUTarget("cuda", arch, 32), options=opts)
        results.append((cfg, ptxas_usage(k.asm["cubin"], arch)))
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--filter", default="", help="substring of case names to compile")
    p.add_argument("--quick", action="store_true", help="only the representative cases in QUICK")
    args = p.parse_args(argv)
    failed = 0
    for case in cases():
        name, kernel, types, consts = case[:4]
        options = case[4] if len(case) > 4 else None
        if args.filter not in name or (args.quick and name not in QUICK):
            continue
        try:
            for cfg, usage in compile_case(kernel, types, consts, options, args.arch):
                print(f"ok   {name:45s} {str(cfg.kwargs if cfg else ''):28s} {usage}", flush=True)
        except Exception as e:  # report every failing kernel, not just the first
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:2000]}", flush=True)
    print(f"{failed} kernel(s) failed to compile")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
