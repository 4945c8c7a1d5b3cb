#!/usr/bin/env python
"""Where a decoded token's time goes in LoLA's layers: wall time per part, no profiler.

    python benchmarks/decode_split.py [--tokens 1024] [--decode 32] [--threads N]

The linearized SmolLM2 with the default ``lola-learned`` method of ``lola niah`` (the shipped
maps, the paper's rule, calibrated budgets, bounded positions): one prefill of ``--tokens``
tokens of the noise haystack, then ``--decode`` greedy tokens, each part of the layers' decode
path timed by ``perf_counter`` around its call (nested parts are inside their parent's time) and
summed over the 30 layers, per decoded token. Stock attention (SDPA + DynamicCache) decodes the
same tokens first in the same process. A profiler's per-call cost inflates the Python-heavy
parts of a step of small operations; wrapping a few calls costs about a microsecond each.
Machines are noisy: compare the parts of one run.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import sys
import time
from pathlib import Path
from typing import Iterator

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import apply_threads, niah_lola_config, noise_ids  # noqa: E402

import lola  # noqa: E402
from lola.integrations.transformers import LoLACache, apply_lola  # noqa: E402

# (owner, attribute, label): the layer's decode path, outermost first
PARTS = (
    ("lola.layer:LoLAAttention", "forward", "LoLA layer forward"),
    ("lola.layer:LoLAAttention", "_check", "  input checks"),
    ("lola.layer:LoLAAttention", "_query_features", "  query features (maps, bounded rotation)"),
    ("lola.engine.composer:LoLAMemory", "decode", "  state.decode"),
    ("lola.engine.block_loop", "write_block", "    write the token"),
    ("lola.engine.block_loop", "step", "    select-and-evict step"),
    ("lola.engine.decode_read:DecodeRead", "add", "    read (views of the slots + decode_step)"),
    ("lola.engine.decode_read", "decode_step", "      decode_step"),
)


@contextlib.contextmanager
def timed_parts(seconds: dict[str, float]) -> Iterator[None]:
    """Wrap each of :data:`PARTS` to add its wall time to ``seconds[label]``; restored on exit."""
    import importlib

    saved = []
    for target, name, label in PARTS:
        module, _, cls = target.partition(":")
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, _original=original, _label=label, **kwargs):
            t0 = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                seconds[_label] += time.perf_counter() - t0

        saved.append((owner, name, original))
        setattr(owner, name, wrapper)
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def decode_ms(model, ids: torch.Tensor, make_cache, decode: int, seconds: dict[str, float] | None = None) -> float:
    """ms per greedy token decoded after a prefill of ``ids`` (the parts timed into ``seconds``)."""
    with torch.inference_mode():
        cache = make_cache()
        token = model(ids, cache=cache).logits[:, -1:].argmax(-1)
        with timed_parts(seconds) if seconds is not None else contextlib.nullcontext():
            t0 = time.perf_counter()
            for _ in range(decode):
                token = model(token, cache=cache).logits[:, -1:].argmax(-1)
            return (time.perf_counter() - t0) / decode * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024, help="prefill tokens")
    parser.add_argument("--decode", type=int, default=32, help="decoded tokens timed after the prefill")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.decode < 1:
        parser.error(f"--decode must be at least 1, got {args.decode}")
    apply_threads(args)
    from lola.pretrained.folder import read_feature_maps

    model, tok = lola.models.load("smollm2-135m-instruct")
    ids = noise_ids(tok, args.tokens)
    method, cfg = niah_lola_config("smollm2-135m-instruct", "smollm2-135m-instruct", "learned", args.tokens)
    decode_ms(model, ids, DynamicCache, 2)  # warm-up
    stock = decode_ms(model, ids, DynamicCache, args.decode)
    apply_lola(model, cfg, feature_maps=read_feature_maps("smollm2-135m-instruct"))
    make_cache = lambda: LoLACache(model)  # noqa: E731
    decode_ms(model, ids, make_cache, 2)  # warm-up
    seconds: dict[str, float] = collections.defaultdict(float)
    total = decode_ms(model, ids, make_cache, args.decode, seconds)
    print(f"\n{method}, {args.tokens} tokens, {args.decode} decoded, {torch.get_num_threads()} threads")
    print(f"stock attention {stock:.1f} ms/token; LoLA {total:.1f} ms/token ({total / stock:.2f}x stock's time)\n")
    print("| part (30 layers, per decoded token) | ms | share of the token |")
    print("|---|---:|---:|")
    for _, _, label in PARTS:
        ms = seconds[label] / args.decode * 1e3
        depth = (len(label) - len(label.lstrip())) // 2  # a part is inside the one above it of lower depth
        print(f"| {'› ' * depth}{label.strip()} | {ms:.2f} | {ms / total:.0%} |")


if __name__ == "__main__":
    main()
