"""Builders the adversarial cases share: tiny models and Hugging Face folders of them, saved
caches, states, commands (and their output read back), hard-linked snapshots, FIFOs, and models
swapped or scripted under a name.

Everything is tiny (two layers, a few heads, a few hundred tokens) and built in the case's own
folder; nothing is downloaded. Feature-map folders, cache edits and tiny transformers models are
the hostile-input tests' own (:mod:`tests.hostile.common`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import lola

from ..common import tiny_model
from .harness import Case, CliResult, Ctx, Expect, cli, ensure

# -- commands and what they write ------------------------------------------------------------------

# `lola niah` on the tiny random Llama: one sample of 400 tokens, one generated token.
NIAH = ["niah", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--max-new-tokens", "1", "--methods", "window"]


# The same with the lola method instead, and with a small window and sparse cache.
NIAH_LOLA = [*NIAH[:-1], "lola"]


LOLA = [*NIAH_LOLA, "--window", "8", "--sparse-size", "8"]


def perplexity(model: str = "tiny-random-llama", method: str = "full", *extra: str) -> list[str]:
    """``lola perplexity`` over one window of 64 tokens of ``model`` with ``method``, nothing generated."""
    return ["perplexity", "--model", model, "--lengths", "64", "--windows", "1", "--generate", "0", "--methods", method, *extra]


PPL = perplexity()
LINEARIZE = ["linearize", "--quick", "--stage", "1", "--steps", "2", "--train-chunks", "1", "--checkpoint-every", "1"]
EXPORT = ["--model", "tiny-random-llama", "--lengths", "512", "--samples", "1"]
PROSE = "The river bends near the old mill. Ships wait at the harbour for the tide. " * 60


def niah(ctx: Ctx, out: str = "r", *extra: str) -> CliResult:
    return cli([*NIAH, "--out", str(ctx.path(out)), *extra])


def niah_config(text: str, name: str = "opts.yaml", argv: list[str] | None = None) -> Callable[[Ctx], CliResult]:
    """A case's run: :func:`niah` (or ``lola ARGV``) with ``--config NAME`` holding ``text``."""

    def run(ctx: Ctx) -> CliResult:
        config = str(ctx.write(name, text))
        return niah(ctx, "r", "--config", config) if argv is None else cli([*argv, "--config", config, "--out", str(ctx.path("r"))])

    return run


def niah_option(id: str, cls: str, option: str, value: str, expect: Expect, what: str | None = None) -> Case:
    """The case ``lola niah OPTION VALUE`` (:data:`NIAH` otherwise), described as ``what`` if given."""
    return Case(id, cls, what or f"lola niah {option} {value}", lambda ctx: niah(ctx, "r", option, value), expect)


_LOADING = re.compile(r"^lola: loading .* \.\.\.$")


def cli_q(argv: list[str]) -> CliResult:
    """``harness.cli``, with the informational ``lola: loading NAME ...`` line that a model
    folder prints dropped from stderr (a note, not part of an error message)."""
    result = cli(argv)
    result.err = "\n".join(line for line in result.err.splitlines() if not _LOADING.match(line.split("\r")[-1]))
    return result


def status(code: int = 0) -> Callable[[Any, Any], None]:
    """A check: the command exited with ``code``."""

    def check(result, ctx):
        from .harness import ensure

        ensure(result.status == code, f"exit {result.status}: {result!r}")

    return check


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


# -- models, layers, states and caches -------------------------------------------------------------


def tiny():
    """The tiny random Llama and its byte tokenizer (a fresh copy each call)."""
    from lola.models import tiny_random

    return tiny_random()


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


def hf_folder(path: Path, model_type: str = "llama", seed: int = 0, **overrides: Any) -> Path:
    """A Hugging Face folder (``config.json``, safetensors weights, a byte-level tokenizer of
    256 ids) holding a tiny random ``model_type`` decoder."""
    from lola.integrations.lm_eval.model import byte_tokenizer

    torch.manual_seed(seed)
    kw = dict(vocab_size=256, max_position_embeddings=1024, eos_token_id=0, pad_token_id=0, bos_token_id=None)
    kw.update(overrides)
    model = tiny_model(model_type, **kw)
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path


LAYER_CFG = lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4)


def layer(cfg: lola.LoLAConfig = LAYER_CFG, heads: int = 4, kv: int = 2, d: int = 8) -> lola.LoLAAttention:
    """A standalone LoLA layer of ``heads`` heads (``kv`` of them for keys and values) of size ``d``."""
    return lola.compose(cfg, num_heads=heads, head_dim=d, num_kv_heads=kv)


def attend(attn, n: int = 40, batch: int = 1, state=None, seed: int = 0, **kwargs):
    """``attn`` over ``n`` random tokens of ``batch`` rows (keys and values: the queries' first
    heads): ``(outputs, state)``."""
    x = torch.randn(batch, n, attn.num_heads, attn.head_dim, generator=torch.Generator().manual_seed(seed))
    kv = attn.num_kv_heads
    with torch.no_grad():
        return attn(x, x[:, :, :kv], x[:, :, :kv], state=state, **kwargs)


def layer_and_state(cfg: lola.LoLAConfig = LAYER_CFG, tokens: int = 40, heads: int = 4, kv: int = 2, d: int = 8, seed: int = 0):
    """A standalone LoLA layer, the state it reached after ``tokens`` tokens, and its state dict."""
    attn = layer(cfg, heads, kv, d)
    state = attn.new_state()
    attend(attn, tokens, state=state, seed=seed)
    return attn, state, {k: t.clone() for k, t in state.state_dict().items()}


def step(attn, state, n: int = 6, seed: int = 5) -> torch.Tensor:
    """Outputs of ``n`` more tokens through ``state``."""
    return attend(attn, n, state=state, seed=seed)[0]


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


def continue_with(model, cache, n: int = 6) -> torch.Tensor:
    """Logits of ``n`` more tokens through ``cache``, one at a time."""
    out = []
    with torch.no_grad():
        for t in range(n):
            out.append(model(torch.tensor([[7 + t]]), cache=cache).logits)
    return torch.cat(out, dim=1)


# -- plug-ins, and models swapped or scripted under a name -----------------------------------------


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


@contextmanager
def schedule(name: str, until: Callable[[torch.Tensor], Any], period: int = 4) -> Iterator[None]:
    """Register for the block a schedule plug-in ``name`` of period ``period`` answering
    ``until(seen)`` tokens until its step."""
    from lola.schedules import register, unregister

    @dataclass(frozen=True)
    class Plugin:
        period: int

        def tokens_until_step(self, seen):
            return until(seen)

    register(name, lambda chunk: Plugin(period), overwrite=True)
    try:
        yield
    finally:
        unregister(name)


@contextmanager
def loads(make: Callable[[], tuple[Any, Any]]) -> Iterator[None]:
    """``lola.models.load`` returns ``make()`` whatever the name (a model folder whose content
    changed, or a model scripted to fail)."""

    def load(name, **kwargs):
        return make()

    with patched("lola.models", "load", load):
        yield


def other_weights(seed: int = 1) -> Callable[[], tuple[Any, Any]]:
    """The tiny random Llama with other weights (``seed``): what ``--model`` now holds."""

    def make():
        from lola.models import tiny_random

        return tiny_random(seed=seed)

    return make


def scripted(on_generate: Callable[[int], None] | None = None, on_forward: Callable[[int], None] | None = None) -> Callable[[], tuple[Any, Any]]:
    """The tiny random Llama whose ``generate`` / ``forward`` first calls ``on_generate(n)`` /
    ``on_forward(n)`` (``n``: the call's number, from 1), e.g. to raise KeyboardInterrupt or to
    change a file while the command runs."""

    def make():
        from lola.models import tiny_random

        model, tok = tiny_random()
        for name, hook in (("generate", on_generate), ("forward", on_forward)):
            if hook is not None:
                setattr(model, name, _counted(getattr(model, name), hook))
        return model, tok

    return make


def _counted(method: Callable, hook: Callable[[int], None]) -> Callable:
    """``method``, calling ``hook(n)`` first on its ``n``-th call (from 1)."""
    calls = 0

    def call(*args, **kwargs):
        nonlocal calls
        calls += 1
        hook(calls)
        return method(*args, **kwargs)

    return call


def interrupt_after(n: int) -> Callable[[int], None]:
    """A hook raising KeyboardInterrupt (Ctrl-C) from its ``n + 1``-th call on."""

    def hook(count: int) -> None:
        if count > n:
            raise KeyboardInterrupt

    return hook


# -- files -----------------------------------------------------------------------------------------


def edit_json(path: Path, change: Callable[[dict], Any]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def hardlink_tree(src: Path, dst: Path) -> Path:
    """``cp -al SRC DST``: a snapshot whose files are hard links to the originals."""
    for p in sorted(src.rglob("*")):
        target = dst / p.relative_to(src)
        if p.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(p, target)
    return dst


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


# -- batch 3: the other commands that own a folder or a file, run locks, small models ---------------

# `lola probe` on the tiny random Llama: one prompt of 400 tokens, the hybrid (the one method
# with a state that needs no sparse cache), one generated token.
PROBE = ["probe", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--max-new-tokens", "1", "--methods", "hybrid"]

# `lola sweep` on the tiny random Llama: one point (400 tokens, 1/8 of them exact), noise, one sample.
SWEEP = ["sweep", "--model", "tiny-random-llama", "--lengths", "400", "--budgets", "1/8", "--haystacks", "noise", "--samples", "1"]

CALIBRATE = ["calibrate", "--model", "tiny-random-llama", "--length", "256", "--prompts", "1"]

# `lola perplexity` of full attention and the hybrid (no lola method) over one window of 64 tokens.
PPL_NO_LOLA = ["perplexity", "--model", "tiny-random-llama", "--lengths", "64", "--windows", "1", "--generate", "0", "--methods", "full", "hybrid"]


def probe(ctx: Ctx, out: str = "p", *extra: str) -> CliResult:
    return cli([*PROBE, "--out", str(ctx.path(out)), *extra])


def sweep(ctx: Ctx, out: str = "s", *extra: str) -> CliResult:
    return cli([*SWEEP, "--out", str(ctx.path(out)), *extra])


def ppl(ctx: Ctx, argv: list[str] | None = None, *extra: str) -> CliResult:
    """``lola perplexity`` (:data:`PPL` unless ``argv``) on the prose of :func:`hay`."""
    return cli([*(argv or PPL), "--text", str(hay(ctx)), *extra])


def fit(ctx: Ctx, out: str = "s.safetensors", *extra: str) -> CliResult:
    """``lola fit-scorer`` on the tiny random Llama: two chunks of 96 tokens, one held out."""
    from ..common import FIT_ARGS, text_file

    text = ctx.path("fit.txt") if ctx.path("fit.txt").is_file() else text_file(ctx.dir, "fit.txt")
    return cli(["fit-scorer", "--model", "tiny-random-llama", "--text", str(text), *FIT_ARGS, "--out", str(ctx.path(out)), *extra])


def first_ok(result: CliResult, what: str = "the first run") -> CliResult:
    """``result`` if the command succeeded; else the case itself is broken (a harness error)."""
    if result.status != 0:
        raise RuntimeError(f"{what} failed: {result!r}")
    return result


def described(what: str) -> Callable[[Any, Ctx], None]:
    """A check that describes what an input that should have been refused did instead."""

    def check(result, ctx):
        from .harness import CaseFailure

        raise CaseFailure(what)

    return check


def lock_file(folder: Path, pid: int, command: str = "lola niah") -> Path:
    """``folder/.lola-run.json`` naming ``pid`` running ``command``, as :func:`lola.io.outputs.run_lock` writes it."""
    from lola.io.outputs import RUN_FILE

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RUN_FILE
    path.write_text(json.dumps({"pid": pid, "command": command, "started": "2025-01-01 00:00:00"}) + "\n")
    return path


@contextmanager
def held(folder: Path, command: str = "lola niah") -> Iterator[None]:
    """Another live run holds ``folder`` for the block: its lock (``flock`` of the folder, taken on
    a descriptor of our own, as another process's would be) and ``.lola-run.json`` naming a live
    pid (this process's parent)."""
    import fcntl

    lock_file(folder, os.getppid(), command)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def dead_pid() -> int:
    """The pid of a process that has exited (a stale lock's holder)."""
    import subprocess

    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


@contextmanager
def short_lock_wait(seconds: float = 1.0) -> Iterator[None]:
    """A write waits ``seconds`` (not a minute) for another process's lock before refusing."""
    with patched("lola.io.outputs", "LOCK_WAIT", seconds):
        yield


def small_lola(cfg: lola.LoLAConfig | None = None, model_type: str = "llama", **overrides: Any):
    """A tiny transformers model (256 positions, :data:`tests.hostile.common.SMALL`) with LoLA
    applied (``cfg``; by default nothing is ever evicted from 64 exact tokens)."""
    from lola.integrations.transformers import apply_lola

    model = tiny_model(model_type, **overrides)
    apply_lola(model, cfg or lola.LoLAConfig(window=64, sparse_size=0, sinks=0, chunk=64))
    return model


def stock_and_lola(cfg: lola.LoLAConfig | None = None, dtype: torch.dtype | None = None, **overrides: Any):
    """The same tiny Llama twice, stock (eager) and with LoLA applied (``cfg``, by default evicting
    nothing), queries scaled by 8 in both so that a wrong mask or scale shows; both cast to
    ``dtype`` (if given) before LoLA is applied."""
    from lola.integrations.transformers import apply_lola

    pair = []
    for _ in range(2):
        model = tiny_model("llama", **overrides)
        with torch.no_grad():
            for m in model.modules():
                if hasattr(m, "q_proj"):
                    m.q_proj.weight.mul_(8)
        pair.append(model if dtype is None else model.to(dtype))
    apply_lola(pair[1], cfg or lola.LoLAConfig(window=64, sparse_size=0, sinks=0, chunk=64))
    return pair[0], pair[1]


def new_cache(model):
    from lola.integrations.transformers import LoLACache

    return LoLACache(model)


def maps_folder(ctx: Ctx, name: str = "maps") -> Path:
    """A valid feature-map folder for the tiny random Llama (random Hedgehog maps)."""
    from ..common import write_random_maps

    return write_random_maps(ctx.path(name))
