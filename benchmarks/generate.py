"""Prefill and decode speed and cache size of LoLA vs stock transformers on SmolLM2-135M-Instruct.

    python benchmarks/generate.py [--contexts 1024 4096 8192 16384] [--decode 16] [--configs uniform calibrated] [--prefill-chunk 256]
    python benchmarks/generate.py --feature-maps smollm2-135m-instruct [--policy learned] [--contexts 2048 4096]

Methods: stock (SDPA attention + DynamicCache) and LoLA (apply_lola + LoLACache, SRE) in each
of ``--configs``: ``uniform`` and ``calibrated`` are the lola method as ``lola niah`` runs it
(window 60, sparse 192 per K/V head, sinks 4, chunk 64), with uniform sizes and with the
model's shipped calibrated budgets (the same slots; the running state holds more bytes, see
``benchmarks/state_bytes.py``); ``small`` is window 64, sparse 64 (the
figures of docs/performance.md before 2026-12-02). For each method the context is built up by
prefill in 1,024-token segments; at each context length, ``--decode`` greedy tokens are timed
one by one. ``--prefill-chunk P [P ...]`` times each LoLA config once per ``P``, its prefill
stepping every ``P`` tokens (decoding still every chunk; ``Chunkwise(64, prefill_chunk=P)``;
``64``: every chunk, the plain schedule).
Prefill throughput at a context is that of the 1,024-token segment ending there (the first
segment for 1024; the segment from 15K to 16K for 16384). Prints tokens/s, ms/token and cache
bytes per context, then the ratios LoLA vs stock at the smallest and the largest context, and
LoLA's decode at the largest context vs its own at the smallest, and calibrated vs uniform.
With ``--feature-maps``, LoLA is the linearized model as the default ``lola niah`` runs its
``lola-<policy>`` method (the shipped maps and adapters, the paper's rule, calibrated budgets, the
share cap, bounded positions, the prefill's chunk), against stock attention on the stock weights.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import DynamicCache

import lola
from lola.eval.niah import NOISE
from lola.integrations.transformers import LoLACache, apply_lola, remove_lola


def stock_bytes(cache: DynamicCache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values) if t is not None)


def noise_stream(tok, contexts: list[int], decode: int) -> torch.Tensor:
    """``[1, N]`` ids of the noise haystack's sentence repeated: enough for the largest of
    ``contexts`` plus ``decode`` tokens at each."""
    text = "\n".join([NOISE] * (contexts[-1] // 10 + 100))
    ids = tok(text, return_tensors="pt").input_ids[:, : contexts[-1] + decode * len(contexts) + 8]
    if ids.shape[1] < contexts[-1]:
        raise SystemExit(f"the text tokenised to only {ids.shape[1]} tokens")
    return ids


def run(model, ids: torch.Tensor, contexts: list[int], decode: int, make_cache, nbytes, after=None) -> list[tuple[int, float, int, float]]:
    """Grow one cache through ``contexts`` (prefill from ``ids``), timing ``decode`` greedy steps at
    each; rows ``(context, decode ms/token, cache bytes, prefill tokens/s of the last segment)``;
    ``after()`` is called after each row (a measurement of the caller's)."""
    cache, consumed, rows = make_cache(), 0, []
    with torch.inference_mode():
        for ctx in contexts:
            while cache.get_seq_length() < ctx:
                n = min(1024, ctx - cache.get_seq_length())
                t0 = time.perf_counter()
                logits = model(ids[:, consumed : consumed + n], cache=cache).logits
                prefill = n / (time.perf_counter() - t0)
                consumed += n
            nxt = logits[:, -1:].argmax(-1)
            t0 = time.perf_counter()
            for _ in range(decode):
                logits = model(nxt, cache=cache).logits
                nxt = logits[:, -1:].argmax(-1)
            rows.append((ctx, (time.perf_counter() - t0) / decode * 1e3, nbytes(cache), prefill))
            print(f"  {ctx:>6} tokens: prefill {prefill:7.1f} tokens/s, decode {rows[-1][1]:8.1f} ms/token, {rows[-1][2] / 2**20:8.1f} MiB", flush=True)
            if after is not None:
                after()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8192, 16384])
    parser.add_argument("--decode", type=int, default=16, help="greedy tokens timed at each context length")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--configs", nargs="+", choices=("uniform", "calibrated", "small"), default=["uniform", "calibrated"], help="LoLA configs to time")
    parser.add_argument(
        "--prefill-chunk", type=int, nargs="+", default=[64], help="tokens between steps within a prefill segment, one run each (multiples of 64; default: 64)"
    )
    parser.add_argument("--feature-maps", help="time the linearized model as `lola niah` runs its lola method (a shipped name or folder)")
    parser.add_argument("--policy", default="learned", help="with --feature-maps: the lola method's policy")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    contexts = sorted(args.contexts)
    model, tok = lola.models.load(args.model)
    ids = noise_stream(tok, contexts, args.decode)

    print("stock transformers (SDPA + DynamicCache)")
    stock = run(model, ids, contexts, args.decode, DynamicCache, stock_bytes)
    results = {}
    if args.feature_maps:
        from lola.eval.niah_spec import NiahRun, method_configs
        from lola.pretrained.folder import read_feature_maps

        run_spec = NiahRun(model=args.model, feature_maps=args.feature_maps, methods=["lola"], policies=[args.policy], lengths=contexts, samples=1)
        ((name, cfg),) = method_configs(run_spec).items()
        apply_lola(model, cfg, feature_maps=read_feature_maps(args.feature_maps))
        print(describe(name, cfg))
        results[name] = run(model, ids, contexts, args.decode, lambda: LoLACache(model), lambda c: c.nbytes())
        remove_lola(model)
        args.configs = []
    for config in args.configs:
        for prefill in args.prefill_chunk:
            name = config if len(args.prefill_chunk) == 1 else f"{config}, prefill chunk {prefill}"
            cfg = lola_config(config, args.model)
            if prefill != cfg.chunk:
                cfg = cfg.model_copy(update={"schedule_kwargs": {"prefill_chunk": prefill}})
            apply_lola(model, cfg)
            print(describe(name, cfg))
            results[name] = run(model, ids, contexts, args.decode, lambda: LoLACache(model), lambda c: c.nbytes())
            remove_lola(model)

    for name, lola_rows in results.items():
        print(f"\nlola {name}\n")
        print("| context | stock prefill tok/s | lola prefill tok/s | stock ms/token | lola ms/token | stock cache MiB | lola cache MiB |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for (c, ts, bs, ps), (_, tl, bl, pl) in zip(stock, lola_rows):
            print(f"| {c} | {ps:.0f} | {pl:.0f} | {ts:.1f} | {tl:.1f} | {bs / 2**20:.1f} | {bl / 2**20:.2f} |")
        for (c, ts, bs, ps), (_, tl, bl, pl) in dict.fromkeys(((stock[0], lola_rows[0]), (stock[-1], lola_rows[-1]))):
            print(
                f"\nat {c}: lola {name} decode {tl / ts:.2f}x stock's ms/token ({ts / tl:.2f}x as fast), prefill {pl / ps:.2f}x stock's tokens/s, "
                f"cache {bs / bl:.1f}x smaller"
            )
        print(f"lola {name} decode at {lola_rows[-1][0]} vs its own at {lola_rows[0][0]}: {lola_rows[-1][1] / lola_rows[0][1]:.2f}x time")
    if "uniform" in results and "calibrated" in results:
        for (c, tu, bu, pu), (_, tc, bc, pc) in zip(results["uniform"], results["calibrated"]):
            print(f"at {c}: calibrated vs uniform: decode {tc / tu:.2f}x the ms/token, prefill {pc / pu:.2f}x the tokens/s, cache {bc / bu:.2f}x the bytes")


def lola_config(name: str, model: str) -> lola.LoLAConfig:
    """The LoLA config ``name`` (see the module docstring) for ``model``."""
    if name == "small":
        return lola.LoLAConfig(window=64, sparse_size=64, sinks=4, chunk=64, policy="sre")
    from lola.eval.niah_spec import NiahRun
    from lola.methods import method_config
    from lola.pretrained.resolve import resolve_config

    d = {f: NiahRun.model_fields[f].default for f in ("window", "sparse_size", "sinks", "chunk")}
    base = method_config("lola", policy="sre", trained_maps=False, **d)
    return resolve_config(base, model=model, budgets="auto" if name == "calibrated" else "uniform")


def describe(name: str, cfg: lola.LoLAConfig) -> str:
    sizes = cfg.model_dump_json(include={"window", "sparse_size", "sinks", "chunk", "schedule_kwargs", "policy"})
    return f"lola {name} ({sizes}{', per-head sparse sizes in ' + str(len(cfg.layer_overrides)) + ' layers' if cfg.layer_overrides else ''})"


if __name__ == "__main__":
    main()
