"""Builders the cases share: tiny models, feature-map folders, saved caches, states, commands.

Everything is tiny (two layers, a few heads, a few hundred tokens) and built in the case's own
folder; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from harness import CliResult, Ctx, cli, ensure

import lola

# `lola niah` on the tiny random Llama: one sample of 400 tokens, one generated token.
NIAH = ["niah", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--max-new-tokens", "1", "--methods", "window"]
PPL = ["perplexity", "--model", "tiny-random-llama", "--lengths", "64", "--windows", "1", "--generate", "0", "--methods", "full"]
LINEARIZE = ["linearize", "--quick", "--stage", "1", "--steps", "2", "--train-chunks", "1", "--checkpoint-every", "1"]
EXPORT = ["--model", "tiny-random-llama", "--lengths", "512", "--samples", "1"]
PROSE = "The river bends near the old mill. Ships wait at the harbour for the tide. " * 60


def tiny():
    """The tiny random Llama and its byte tokenizer (a fresh copy each call)."""
    from lola.models import tiny_random

    return tiny_random()


DROP = object()
"""An override that removes a default key of :func:`tiny_model` (e.g. ``head_dim=DROP``)."""


def tiny_model(model_type: str, **overrides: Any):
    """A tiny random decoder of ``model_type`` from transformers' classes (eager attention)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(
        vocab_size=101,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
    )
    kw.update(overrides)
    kw = {k: v for k, v in kw.items() if v is not DROP}
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **kw)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


def ids(n: int = 24, vocab: int = 101, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


def reproduces(model, n: int = 24) -> tuple[bool, float]:
    """Whether LoLA with nothing evicted (window over the whole sequence, softmax only) gives
    the stock logits; returns ``(same, max difference)``."""
    from lola.integrations.transformers import patch

    x = ids(n, model.config.vocab_size)
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "q_proj"):
                m.q_proj.weight.mul_(8)  # peaked attention: a wrong scale or window shows
        ref = model(x).logits
        with patch(model, lola.LoLAConfig(window=64, sparse_size=0, sinks=0, chunk=64, mixing="softmax_only")):
            out = model(x, use_cache=False).logits
    diff = float((out - ref).abs().max())
    return diff < 1e-3, diff


def check_reproduces(model_box: dict) -> Callable[[Any, Ctx], None]:
    """A check: the model the case stored in ``model_box`` reproduces its stock logits."""

    def check(_: Any, ctx: Ctx) -> None:
        same, diff = reproduces(model_box["model"])
        ensure(same, f"accepted, but LoLA with nothing evicted differs from the stock logits by {diff:.3g}")

    return check


def write_maps(folder: Path, seed: int = 0, f: int = 8, **kwargs: Any) -> Path:
    """A valid feature-map folder for the tiny random Llama (random Hedgehog maps)."""
    from lola.pretrained.folder import model_geometry, write_feature_maps

    model, _ = tiny()
    geometry = model_geometry(model)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(geometry["num_layers"]):
        prefix = f"model.layers.{i}.self_attn."
        for side in ("q", "k"):
            tensors[prefix + f"feature_map_{side}.mlp.layer"] = torch.randn(geometry["num_heads"], geometry["head_dim"], f, generator=g)
        tensors[prefix + "window_factors"] = torch.zeros(1, geometry["num_heads"], 1, 1)
    cfg = lola.LoLAConfig(window=8, sparse_size=0, sinks=0, schedule="tokenwise", feature_map="hedgehog", feature_dim=f, mixing="lolcats")
    write_feature_maps(folder, tensors, cfg, geometry, **kwargs)
    return folder


def edit_json(path: Path, change: Callable[[dict], Any]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def rehash_maps(folder: Path) -> None:
    """Record the files' new sums in ``lola_config.json`` (a deliberate edit, not damage)."""
    path = folder / "lola_config.json"
    meta = json.loads(path.read_text())
    meta["files"] = {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in meta.get("files", {})}
    path.write_text(json.dumps(meta))


CACHE_CFG = dict(window=8, sparse_size=4, sinks=2, chunk=4)


def saved_cache(folder: Path, tokens: int = 30, **cfg: Any):
    """A LoLA-applied tiny model, a LoLACache that has seen ``tokens`` tokens, saved to ``folder``."""
    from lola.integrations.transformers import LoLACache, apply_lola

    model, _ = tiny()
    apply_lola(model, lola.LoLAConfig(**{**CACHE_CFG, **cfg}))
    cache = LoLACache(model)
    with torch.no_grad():
        model(ids(tokens, 256), cache=cache)
    cache.save(folder)
    return model, cache


def edit_cache(folder: Path, change_tensors: Callable[[dict], Any] | None = None, change_meta: Callable[[dict], Any] | None = None) -> None:
    """Edit a saved cache and record the new sums, as a deliberate edit would."""
    from safetensors.torch import load_file, save

    from lola.integrations.transformers.cache import _meta_checksum

    meta = json.loads((folder / "cache.json").read_text())
    if change_tensors is not None:
        tensors = load_file(folder / meta["tensors"])
        change_tensors(tensors)
        data = save(tensors)
        (folder / meta["tensors"]).write_bytes(data)
        meta["sha256"] = hashlib.sha256(data).hexdigest()
    if change_meta is not None:
        change_meta(meta)
    meta["checksum"] = _meta_checksum(meta)
    (folder / "cache.json").write_text(json.dumps(meta))


def continue_with(model, cache, n: int = 6) -> torch.Tensor:
    """Logits of ``n`` more tokens through ``cache``, one at a time."""
    out = []
    with torch.no_grad():
        for t in range(n):
            out.append(model(torch.tensor([[7 + t]]), cache=cache).logits)
    return torch.cat(out, dim=1)


LAYER_CFG = lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4)


def layer_and_state(cfg: lola.LoLAConfig = LAYER_CFG, tokens: int = 40, heads: int = 4, kv: int = 2, d: int = 8, seed: int = 0):
    """A standalone LoLA layer, the state it reached after ``tokens`` tokens, and its state dict."""
    attn = lola.compose(cfg, num_heads=heads, head_dim=d, num_kv_heads=kv)
    x = torch.randn(1, tokens, heads, d, generator=torch.Generator().manual_seed(seed))
    state = attn.new_state()
    with torch.no_grad():
        attn(x, x[:, :, :kv], x[:, :, :kv], state=state)
    return attn, state, {k: t.clone() for k, t in state.state_dict().items()}


def step(attn, state, n: int = 6, seed: int = 5) -> torch.Tensor:
    """Outputs of ``n`` more tokens through ``state``."""
    x = torch.randn(1, n, attn.num_heads, attn.head_dim, generator=torch.Generator().manual_seed(seed))
    kv = attn.num_kv_heads
    with torch.no_grad():
        o, _ = attn(x, x[:, :, :kv], x[:, :, :kv], state=state)
    return o


@contextmanager
def patched(target: Any, name: str, value: Any) -> Iterator[None]:
    """Set ``target.name`` (an object, or a dotted module path) to ``value`` for the block."""
    import importlib

    obj = importlib.import_module(target) if isinstance(target, str) else target
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextmanager
def policy(name: str, factory: Any) -> Iterator[None]:
    """Register a policy plug-in for the block."""
    from lola.policies import register, unregister

    register(name, factory, overwrite=True)
    try:
        yield
    finally:
        unregister(name)


def niah(ctx: Ctx, out: str = "r", *extra: str) -> CliResult:
    return cli([*NIAH, "--out", str(ctx.path(out)), *extra])


def results(ctx: Ctx, out: str = "r") -> dict:
    return json.loads(ctx.path(out).joinpath("results.json").read_text())


def samples(ctx: Ctx, out: str = "r") -> list[dict]:
    return [json.loads(line) for line in ctx.path(out).joinpath("samples.jsonl").read_text().splitlines() if line.strip()]


def hay(ctx: Ctx, name: str = "hay.txt", text: str = PROSE) -> Path:
    return ctx.write(name, text)


def budgets_file(path: Path, layers: int = 2, kv: int = 2, uniform: int = 8, sizes: list[list[int]] | None = None, **extra: Any) -> Path:
    """A hand-written budgets JSON for ``layers × kv`` heads."""
    sizes = sizes if sizes is not None else [[uniform] * kv for _ in range(layers)]
    data = {"sparse_size_per_head": sizes, "uniform_sparse_size": uniform, "scores": [[1.0] * len(r) for r in sizes], "power": 0.5, "source": {}}
    data.update(extra)
    path.write_text(json.dumps(data))
    return path


def lm_eval_model(args: str, via: str = "cli"):
    """The ``lola`` lm-eval model from ``model_args`` as ``lm-eval run --model_args ARGS`` parses
    them (``via="cli"``: ``-1`` becomes ``-1.0``) or as ``simple_evaluate`` does with a string
    (``via="string"``: ``-1`` stays an int)."""
    from lm_eval.api.registry import get_model

    model = get_model("lola")
    if via == "string":
        return model.create_from_arg_string(args, {"device": "cpu"})
    from lm_eval._cli.utils import key_val_to_dict

    return model.create_from_arg_obj(key_val_to_dict(args), {"device": "cpu"})
