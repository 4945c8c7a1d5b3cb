"""Hostile inputs, classes 1 and 2: each mechanism tested as a class, over the kinds of fault it
covers, through the API and through saved files.

- **A state against its memory**: :func:`lola.engine.composer.check_state`, given the memory
  (:meth:`lola.LoLAMemory.load_state_dict`, and so ``LoLACache.load``), compares a state with
  what the memory holds (:meth:`~lola.LoLAMemory.reference_state`): keys, dtypes, shapes but
  the batch, and sums of non-negative terms (``.acc``, ``queries.n``, and ``linear.s`` when the
  layer's feature map is non-negative).
- **A state belongs to one layer**: a layer refuses a state of another index or taken by
  another layer object (``LoLAAttention._check_spec`` / ``_check_owner``).
- **Schedules answer within their period** on every path that asks them
  (``LoLAMemory._check_until``).
- **Policies**: a plug-in's failures and answers are named by its registered name at the select
  step, tokens always outrank empty slots (``SparseCache.select``), factory functions register,
  and options are strict numbers (:func:`lola.policies.registry.options_schema`).
- **Attention implementation**: checked before every forward of a LoLA model (a pre-hook that
  ``remove_lola`` takes away; lola's own implementations and switches, such as stage 2's teacher
  passes, excepted); a LoLA cache layer without its LoLA module is refused.
- **Cache files**: ``cumulative_lengths`` are bounded by the model's positions; ``save`` removes
  only the tensors its earlier ``cache.json`` names.

The examples differ from those of ``benchmarks/adversarial`` on purpose: that pass stays a fresh
check of the same mechanisms.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

import lola
from lola.engine.composer import check_state
from lola.layer import compose, memory_from_config
from tests.hostile.common import edit_cache

transformers = pytest.importorskip("transformers")

CFG = lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3)


def _layer(cfg: lola.LoLAConfig = CFG, layer: int | None = None) -> lola.LoLAAttention:
    return compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2, layer=layer)


def _run(attn, tokens: int = 30, batch: int = 1, state=None, mask=None, seed: int = 0):
    x = torch.randn(batch, tokens, attn.num_heads, attn.head_dim, generator=torch.Generator().manual_seed(seed))
    kv = x[:, :, : attn.num_kv_heads].contiguous()
    with torch.no_grad():
        return attn(x, kv, kv, state=state, padding_mask=mask)


def _decode(attn, state, period: int = 4) -> None:
    """Decode one token at a time for a period: the schedule is asked at the first step (between
    steps the host counts down what it last answered)."""
    for seed in range(1, period + 1):
        _run(attn, tokens=1, batch=2, state=state, seed=seed)


def _saved(cfg: lola.LoLAConfig = CFG):
    """A layer, and the state dict it reached after 30 tokens."""
    attn = _layer(cfg)
    _, state = _run(attn)
    return attn, {k: t.clone() for k, t in state.state_dict().items()}


def _tiny_lola(cfg: lola.LoLAConfig = CFG):
    from lola.integrations.transformers import apply_lola
    from lola.models import tiny_random

    model, _ = tiny_random()
    return apply_lola(model, cfg)


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 200, (1, n), generator=torch.Generator().manual_seed(seed))


def _saved_cache(folder, cfg: lola.LoLAConfig = CFG):
    from lola.integrations.transformers import LoLACache

    model = _tiny_lola(cfg)
    cache = LoLACache(model)
    with torch.no_grad():
        model(_ids(30), cache=cache)
    cache.save(folder)
    return model


# -- a state against its memory ---------------------------------------------------------------------


def _cast(*keys, dtype):
    def edit(sd):
        for key in keys:
            sd[key] = sd[key].to(dtype)

    return edit


def _narrow_head_dim(*keys):
    def edit(sd):
        for key in keys:
            sd[key] = sd[key][..., :4].contiguous()

    return edit


def _negative(key):
    def edit(sd):
        sd[key] = -sd[key].abs() - 0.5

    return edit


def _drop_newest(key):
    """Empty the slot of the newest position held (the window then no longer ends at seen - 1)."""

    def edit(sd):
        pos = sd[key]
        sd[key] = torch.where(pos == pos.amax(-1, keepdim=True), -1, pos)

    return edit


ATTENTION_FUSION = lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, policy="fusion", policy_kwargs={"policies": ["attention", "recency"]})
EXPECTED = lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, policy="expected_attention")
ATTENTION = lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, policy="attention")
ELU = lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, feature_map="elu")

PADDED = lola.LoLAConfig(window=5, sparse_size=2, sinks=1, chunk=2)  # run with a left-padded row

# (id, config, edit of the state dict, the tensor the refusal must name)
STATE_FAULTS = [
    ("unknown-linear-tensor", CFG, lambda sd: sd.update({"linear.bias": torch.zeros(1)}), "linear.bias"),
    ("acc-without-a-tracking-policy", CFG, lambda sd: sd.update({"window.acc": torch.zeros(sd["window.pos"].shape)}), "window.acc"),
    ("acc-missing-for-a-fusion-with-attention", ATTENTION_FUSION, lambda sd: sd.pop("sparse.acc"), "sparse.acc"),
    ("sink-keys-bfloat16", CFG, _cast("sinks.k", "sinks.v", dtype=torch.bfloat16), "sinks.k"),
    ("window-positions-int16", CFG, _cast("window.pos", dtype=torch.int16), "window.pos"),
    ("seen-uint8", CFG, _cast("seen", dtype=torch.uint8), "seen"),
    ("sink-head-dim-4", CFG, _narrow_head_dim("sinks.k", "sinks.v"), "sinks.k"),
    ("linear-head-dim-4", CFG, _narrow_head_dim("linear.H"), "linear.H"),
    ("linear-rows-2", CFG, lambda sd: sd.update({"linear.s": sd["linear.s"].expand(2, -1, -1).clone()}), "linear.s"),
    ("elu-normaliser-negative", ELU, _negative("linear.s"), "linear.s"),
    ("attention-mass-negative", ATTENTION, _negative("sparse.acc"), "sparse.acc"),
    ("query-weight-negative", EXPECTED, _negative("queries.n"), "queries.n"),
    ("linear-state-on-meta", CFG, lambda sd: sd.update({"linear.H": sd["linear.H"].to("meta")}), "linear.H"),
    ("window-emptied", CFG, lambda sd: sd.update({"window.pos": torch.full_like(sd["window.pos"], -1)}), "window.pos"),
    ("window-lost-its-newest-token", CFG, _drop_newest("window.pos"), "window.pos"),
    ("seen-lowered-by-one-below-the-window", CFG, lambda sd: sd.update(seen=sd["seen"] + 1), "window.pos"),
]


class TestAStateAgainstItsMemory:
    """``check_state(state, memory)``: one check of every state from outside, at load."""

    @pytest.mark.parametrize("cfg, edit, key", [f[1:] for f in STATE_FAULTS], ids=[f[0] for f in STATE_FAULTS])
    def test_a_state_no_run_could_write_is_refused_at_load_naming_the_tensor(self, cfg, edit, key):
        attn, sd = _saved(cfg)
        edit(sd)
        with pytest.raises(ValueError, match=re.escape(key)):
            attn.new_state().load_state_dict(sd)

    def test_a_memory_no_layer_took_is_checked_against_the_state_s_own_geometry(self):
        """A hand-built memory knows no layout: the geometry is read off the state's linear.H and
        window.k, and a memory that disagrees with it is named."""
        _, sd = _saved()
        _narrow_head_dim("sparse.k", "sparse.v")(sd)
        with pytest.raises(ValueError, match=r"state\['sparse.k'\] has shape .*\[B, 2, 3, 8\]"):
            memory_from_config(CFG).load_state_dict(sd)

    def test_a_state_on_another_device_than_the_memory_s_is_refused_naming_the_tensor(self):
        attn, sd = _saved()
        _, used = _run(attn)  # allocated on the CPU
        sd["sparse.v"] = sd["sparse.v"].to("meta")
        with pytest.raises(ValueError, match=r"state\['sparse.v'\] lies on the meta device"):
            used.load_state_dict(sd)

    def test_the_odd_dtype_out_is_named_not_the_others(self):
        _, sd = _saved()
        _cast("window.k", "window.v", dtype=torch.float16)(sd)
        with pytest.raises(ValueError, match=r"state\['window.k'\] must be torch.float32 floats like the state's other keys"):
            check_state(sd, _layer().new_state())

    @pytest.mark.parametrize(
        "cfg",
        [
            lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, feature_map="taylor"),  # features of either sign
            lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, sparse_size_per_head=[3, 0]),  # ragged storage
            lola.LoLAConfig(window=6, sparse_size=3, sinks=0, chunk=3, gqa_storage="query_head", policy="expected_attention"),
            ATTENTION_FUSION,
            lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, window_per_head=[6, 2]),
            lola.LoLAConfig(window=6, sparse_size=3, sinks=2, chunk=1, schedule="tokenwise"),
            lola.LoLAConfig(window=0, sparse_size=3, sinks=1, chunk=3),
            PADDED,
        ],
        ids=["taylor", "ragged-sparse", "query-head-storage", "tracked-attention", "per-head-windows", "tokenwise", "no-window", "padded-rows"],
    )
    def test_a_state_a_run_wrote_loads_and_continues_alike(self, cfg):
        attn = _layer(cfg)
        padded = cfg is PADDED
        _, state = _run(attn, batch=2 if padded else 1, mask=_padded() if padded else None)
        sd = {k: t.clone() for k, t in state.state_dict().items()}
        if cfg.feature_map == "taylor":  # the check is the map's: here s has negative entries
            assert bool((sd["linear.s"] < 0).any())
        loaded = attn.new_state()
        loaded.load_state_dict(sd)
        a, _ = _run(attn, tokens=5, batch=2 if padded else 1, state=state, seed=1)
        b, _ = _run(attn, tokens=5, batch=2 if padded else 1, state=loaded, seed=1)
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    # (id, edit of the saved tensors, fragment)
    FILE_FAULTS = [
        ("sink-values-float16", _cast("layers.1.sinks.k", "layers.1.sinks.v", dtype=torch.float16), "layers.1.sinks.k|'sinks.k'"),
        ("window-positions-int32", _cast("layers.0.window.pos", dtype=torch.int32), "'window.pos'"),
        ("normaliser-negative", _negative("layers.1.linear.s"), "'linear.s'"),
        ("unknown-tensor", lambda t: t.update({"layers.0.sparse.scale": torch.ones(1)}), "'sparse.scale'"),
        ("linear-head-dim-4", _narrow_head_dim("layers.0.linear.H"), "'linear.H'"),
    ]

    @pytest.mark.parametrize("edit, fragment", [f[1:] for f in FILE_FAULTS], ids=[f[0] for f in FILE_FAULTS])
    def test_an_edited_saved_cache_is_refused_at_load_naming_file_and_tensor(self, tmp_path, edit, fragment):
        from lola.integrations.transformers import LoLACache

        model = _saved_cache(tmp_path / "c")
        edit_cache(tmp_path / "c", tensors=edit)
        with pytest.raises(ValueError, match=r"cache-[0-9a-f]{16}\.safetensors: layer \d's state does not fit .*(" + fragment + ")"):
            LoLACache.load(tmp_path / "c", model)


# -- a state belongs to one layer -----------------------------------------------------------------


class TestAStateBelongsToOneLayer:
    """A state records its layer's index and the layer object that took it; no other reads it."""

    def test_a_state_of_another_layer_index_is_refused(self):
        _, state = _run(_layer(layer=2))
        with pytest.raises(ValueError, match="state belongs to layer 2, this is layer 5"):
            _run(_layer(layer=5), state=state)

    @pytest.mark.parametrize("allocated", [True, False], ids=["used", "fresh"])
    def test_a_state_taken_by_another_layer_of_the_same_configuration_is_refused(self, allocated):
        a, b = _layer(), _layer()
        state = _run(a)[1] if allocated else a.new_state()
        with pytest.raises(ValueError, match="taken by another LoLA layer of the same configuration"):
            _run(b, state=state)

    def test_a_state_no_layer_took_is_taken_by_the_first_that_reads_it(self):
        a, b = _layer(), _layer()
        state = memory_from_config(CFG)
        _run(a, state=state)
        assert state.owner() is a
        with pytest.raises(ValueError, match="taken by another LoLA layer"):
            _run(b, state=state)

    def test_a_state_moved_to_another_layer_of_the_same_cache_is_refused(self):
        from lola.integrations.transformers import LoLACache

        model = _tiny_lola()
        cache = LoLACache(model)
        with torch.no_grad():
            model(_ids(20), cache=cache)
            cache.layers[0].state = cache.layers[1].state
            with pytest.raises(ValueError, match="state belongs to layer 1, this is layer 0"):
                model(_ids(1, seed=1), cache=cache)

    def test_a_state_of_an_identical_model_s_cache_is_refused(self, tmp_path):
        """Two models with the same weights are still two models: a state belongs to the layer
        object that took it (so a loaded cache is taken by the model it was loaded for)."""
        from lola.integrations.transformers import LoLACache

        a = _saved_cache(tmp_path / "c")
        b = _tiny_lola()
        theirs = LoLACache.load(tmp_path / "c", a)
        ours = LoLACache.load(tmp_path / "c", b)  # same weights: the fingerprint matches
        ours.layers[1].state = theirs.layers[1].state
        with torch.no_grad(), pytest.raises(ValueError, match="another model's"):
            b(_ids(1, seed=2), cache=ours)

    def test_a_state_from_before_lola_was_reapplied_is_refused(self):
        from lola.integrations.transformers import LoLACache, apply_lola, remove_lola

        model = _tiny_lola()
        old = LoLACache(model)
        with torch.no_grad():
            model(_ids(20), cache=old)
        remove_lola(model)
        apply_lola(model, CFG)
        cache = LoLACache(model)
        cache.layers[0].state = old.layers[0].state
        with torch.no_grad(), pytest.raises(ValueError, match="before LoLA was re-applied"):
            model(_ids(1, seed=3), cache=cache)


# -- schedules answer within their period ---------------------------------------------------------


@dataclass
class Flaky:
    """A schedule plug-in (period 4) that answers ``bad`` for its next ``times`` calls, then
    chunkwise; a bounded fault, so that code without the check does not loop forever."""

    period: int = 4
    bad: int = field(default=0, repr=False)  # out of the repr: the layer compares its spec
    times: int = field(default=0, repr=False)

    def tokens_until_step(self, seen):
        if self.times > 0:
            self.times -= 1
            return torch.full_like(seen, self.bad)
        return self.period - seen % self.period


@pytest.fixture
def flaky():
    from lola.schedules import register, unregister

    schedule = Flaky()
    register("flaky_test", lambda chunk: schedule, overwrite=True)
    yield schedule
    unregister("flaky_test")


def _padded(batch: int = 2, tokens: int = 30) -> torch.Tensor:
    mask = torch.ones(batch, tokens, dtype=torch.bool)
    mask[1, :3] = False  # a left-padded row: rows out of step, the per-row paths
    return mask


class TestSchedulesAnswerWithinTheirPeriod:
    """``_check_until``: every path that asks the schedule refuses an answer outside 1..period."""

    PATHS = ["attend-in-step", "attend-per-row", "decode-in-step", "decode-per-row"]

    @pytest.mark.parametrize("bad", [0, 5, -3], ids=["zero", "beyond-period", "negative"])
    @pytest.mark.parametrize("path", PATHS)
    def test_an_answer_outside_1_to_period_is_refused_naming_the_schedule(self, flaky, path, bad):
        attn = _layer(lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=4, schedule="flaky_test"))
        mask = _padded() if path.endswith("per-row") else None
        if path.startswith("decode"):
            _, state = _run(attn, batch=2, mask=mask)
            flaky.bad, flaky.times = bad, 1
            call = functools.partial(_decode, attn, state)
        else:
            flaky.bad, flaky.times = bad, 1
            call = functools.partial(_run, attn, batch=2, mask=mask)
        with pytest.raises(ValueError, match=rf"schedule Flaky\(.*\) returned {bad} tokens until its step, expected 1\.\.4"):
            call()

    @pytest.mark.parametrize("path", PATHS)
    def test_an_early_step_is_within_the_period_and_runs(self, flaky, path):
        attn = _layer(lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=4, schedule="flaky_test"))
        mask = _padded() if path.endswith("per-row") else None
        _, state = _run(attn, batch=2, mask=mask)
        flaky.bad, flaky.times = 1, 1  # a step after the next token: always allowed
        _run(attn, tokens=1 if path.startswith("decode") else 5, batch=2, state=state, seed=1)


@dataclass(frozen=True)
class Answering:
    """A schedule plug-in (period 4) answering ``answer(seen)``."""

    answer: object = field(repr=False)
    period: int = 4

    def tokens_until_step(self, seen):
        return self.answer(seen)


def _answering(answer, period: int = 4):
    from lola.schedules import register

    register("answering_test", lambda chunk: Answering(answer, period), overwrite=True)
    return lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=4, schedule="answering_test")


@pytest.fixture
def answering():
    from lola.schedules import unregister

    yield _answering
    unregister("answering_test")


class TestSchedulesAnswerWithTokenCounts:
    """``LoLAMemory._ask_schedule``: the one way the composer asks a schedule; a failure or an
    answer that is not an integer tensor like ``seen`` is named by the schedule, on every path."""

    ANSWERS = [
        ("float-tensor", lambda seen: (4 - seen % 4).double(), TypeError, r"returned torch.float64 from tokens_until_step\(\)"),
        ("bool-tensor", lambda seen: torch.ones_like(seen, dtype=torch.bool), TypeError, r"returned torch.bool from tokens_until_step\(\)"),
        ("numpy", lambda seen: np.ones(tuple(seen.shape), dtype=np.int64), TypeError, r"returned ndarray .* from tokens_until_step\(\)"),
        ("one-row", lambda seen: (4 - seen % 4)[:1].repeat(3), ValueError, r"returned shape \(3,\) from tokens_until_step\(\)"),
        ("attribute-error", lambda seen: seen.no_such_thing, RuntimeError, r"failed in tokens_until_step\(\): AttributeError"),
    ]

    @pytest.mark.parametrize("answer, kind, fragment", [a[1:] for a in ANSWERS], ids=[a[0] for a in ANSWERS])
    @pytest.mark.parametrize("path", TestSchedulesAnswerWithinTheirPeriod.PATHS)
    def test_an_odd_answer_or_a_failure_is_named_by_the_schedule(self, answering, path, answer, kind, fragment):
        calls = {"n": 0}

        def later(seen):  # the first prefill answers well, so that the decode paths are reached
            calls["n"] += 1
            return answer(seen) if path.startswith("attend") or calls["n"] > 100 else 4 - seen % 4

        attn = _layer(answering(later))
        mask = _padded() if path.endswith("per-row") else None
        if path.startswith("decode"):
            _, state = _run(attn, batch=2, mask=mask)
            calls["n"] = 101
            call = functools.partial(_decode, attn, state)
        else:
            call = functools.partial(_run, attn, batch=2, mask=mask)
        with pytest.raises(kind, match=rf"schedule Answering\(period=4\) {fragment}"):
            call()

    @pytest.mark.parametrize("period", [2**30, True, 0], ids=["2**30", "bool", "zero"])
    def test_a_period_beyond_the_bounds_is_refused_at_build_naming_the_schedule(self, answering, period):
        from lola.schedules import build, register

        register("answering_test", lambda chunk: Answering(torch.ones_like, period), overwrite=True)
        refusal = rf"schedule 'answering_test' built .* with period {period!r}: expected an int in 1\.\.16777216"
        with pytest.raises(ValueError, match=refusal):
            build("answering_test", chunk=4)
        with pytest.raises(ValueError, match=refusal):  # through the config, before anything is allocated
            lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=4, schedule="answering_test")


# -- policies -----------------------------------------------------------------------------------


def _scorer(fn):
    @dataclass(frozen=True)
    class Scorer:
        needs_attention = False

        def score(self, candidates, ctx):
            return fn(candidates)

    return Scorer


@pytest.fixture
def plugin():
    from lola.policies import register, unregister

    names = []

    def add(name, factory):
        register(name, factory, overwrite=True)
        names.append(name)
        return name

    yield add
    for name in names:
        unregister(name)


def _with_policy(name, **options):
    cfg = lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, policy=name, **options)
    return _run(_layer(cfg))[1]


def _minus_inf_but_the_newest(c):
    s = torch.full(c.pos.shape, float("-inf"))
    s[..., -1] = 1.0
    return s


def _minus_inf(c, dtype=torch.float32):
    return torch.full(c.pos.shape, float("-inf"), dtype=dtype)


class TestPolicies:
    """The select step names a plug-in by its registered name; tokens outrank empty slots; the
    registry takes factory functions and strict option numbers."""

    # (id, score function, error type, fragment after the policy's name)
    ANSWERS = [
        ("numpy-array", lambda c: np.zeros(tuple(c.pos.shape), dtype=np.float32), TypeError, r"returned a ndarray from score\(\), expected a tensor"),
        ("one-axis-short", lambda c: c.pos.float()[..., 0], ValueError, "returned scores of shape"),
        ("index-error", lambda c: c.pos[99], RuntimeError, r"failed in score\(\): IndexError"),
        ("value-error", lambda c: float("x"), RuntimeError, r"failed in score\(\): ValueError: could not convert"),
        ("on-meta", lambda c: torch.ones(c.pos.shape, device="meta"), ValueError, r"returned scores on meta, expected them on the candidates' device cpu"),
    ]

    @pytest.mark.parametrize("fn, kind, fragment", [a[1:] for a in ANSWERS], ids=[a[0] for a in ANSWERS])
    def test_a_plug_in_s_failure_or_odd_answer_names_its_registered_name(self, plugin, fn, kind, fragment):
        name = plugin("misbehaving_test", _scorer(fn))
        with pytest.raises(kind, match=rf"policy 'misbehaving_test' \(.*\) {fragment}"):
            _with_policy(name)

    @pytest.mark.parametrize(
        "fn, options, held",
        [
            (_minus_inf, {"sparse_size_per_head": [3, 1]}, [3, 1]),
            (_minus_inf, {"gqa_storage": "query_head"}, [3, 3, 3, 3]),
            (_minus_inf_but_the_newest, {}, [3, 3]),
            (functools.partial(_minus_inf, dtype=torch.float16), {}, [3, 3]),
        ],
        ids=["per-head-sizes", "query-head-storage", "all-but-the-newest", "float16"],
    )
    def test_tokens_scored_minus_inf_still_outrank_empty_slots(self, plugin, fn, options, held):
        name = plugin("minus_inf_test", _scorer(fn))
        state = _with_policy(name, **options)
        assert (state.sparse.block.pos >= 0).sum(-1)[0].tolist() == held

    @pytest.mark.parametrize(
        "factory, kwargs",
        [
            (lambda largest=True: lola.policies.KeyNorm(largest), {"largest": False}),
            (functools.partial(lola.policies.Random, seed=3), {}),
            (lambda: lola.policies.Recency(), {}),
        ],
        ids=["function-with-options", "partial", "lambda"],
    )
    def test_a_factory_function_registers_and_its_policy_runs(self, plugin, factory, kwargs):
        name = plugin("factory_test", factory)
        cfg = lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, policy=name, policy_kwargs=kwargs)
        assert (_run(_layer(cfg))[1].sparse.block.pos >= 0).all()

    @pytest.mark.parametrize("factory", [3, type("NoScore", (), {})], ids=["not-callable", "class-without-score"])
    def test_what_cannot_build_a_policy_is_refused_at_registration(self, factory):
        from lola.policies import register

        with pytest.raises(TypeError, match="policy 'bad_factory_test' must be"):
            register("bad_factory_test", factory)

    def test_a_factory_building_no_policy_is_refused_naming_it(self, plugin):
        name = plugin("builds_a_string_test", lambda: "recency")
        with pytest.raises(TypeError, match="policy 'builds_a_string_test' built 'recency'"):
            lola.policies.build(name)

    REFUSED = [
        ("key_norm", {"largest": 1}, "largest"),
        ("expected_attention", {"horizon": 64.0}, "horizon"),
        ("expected_attention", {"horizon": True}, "horizon"),
        ("sre", {"eps": True}, "eps"),
        ("span", {"across_heads": 0}, "across_heads"),
        ("fusion", {"policies": ["sre", "recency"], "weights": [1.0, False]}, "weights.1"),
    ]

    @pytest.mark.parametrize("policy, options, field", [r for r in REFUSED], ids=[f"{r[0]}-{r[2]}-{list(r[1].values())[-1]!r}" for r in REFUSED])
    def test_an_option_of_the_wrong_number_kind_is_refused_naming_it(self, policy, options, field):
        from pydantic import ValidationError

        with pytest.raises(ValueError, match=rf"policy '{policy}' options: {re.escape(field)}"):
            lola.policies.build(policy, **options)
        with pytest.raises(ValidationError, match=field.split(".")[0]):  # through the config, as a user writes it
            lola.LoLAConfig(policy=policy, policy_kwargs=options)

    @pytest.mark.parametrize(
        "policy, options, attribute, value",
        [("sre", {"eps": 1}, "eps", 1.0), ("fusion", {"policies": ["sre", "recency"], "weights": [2, 1]}, "weights", [2.0, 1.0])],
        ids=["int-for-float", "ints-in-a-float-list"],
    )
    def test_an_int_is_still_a_float(self, policy, options, attribute, value):
        built = lola.policies.build(policy, **options)
        assert getattr(built, attribute) == value
        assert all(type(x) is float for x in np.atleast_1d(getattr(built, attribute)).tolist())


# -- attention implementation -----------------------------------------------------------------------


class TestTheAttentionImplementationIsCheckedOnEveryForward:
    """A pre-hook installed by ``apply_lola`` (removed by ``remove_lola``) refuses a LoLA model
    switched to another attention implementation, whatever the call (lola's own implementations
    and switches excepted)."""

    CALLS = ["forward-without-cache", "forward-with-a-lola-cache", "generate"]

    @pytest.mark.parametrize("call", CALLS)
    def test_a_switched_implementation_is_refused_saying_what_to_do(self, call):
        from lola.integrations.transformers import LoLACache

        model = _tiny_lola()
        model.set_attn_implementation("eager")
        with torch.no_grad(), pytest.raises(ValueError, match=r"attention implementation is now 'eager'.*set_attn_implementation\('lola'\)"):
            if call == "forward-without-cache":
                model(_ids(12), use_cache=False)
            elif call == "forward-with-a-lola-cache":
                model(_ids(12), cache=LoLACache(model))
            else:
                model.generate(_ids(12), max_new_tokens=2, do_sample=False)

    def test_switching_back_runs_lola_again_and_remove_lola_takes_the_check_away(self):
        from lola.integrations.transformers import remove_lola

        model = _tiny_lola()
        model.set_attn_implementation("eager")
        model.set_attn_implementation("lola")
        with torch.no_grad():
            model(_ids(12), use_cache=False)
        remove_lola(model)
        assert not model._forward_pre_hooks
        model.set_attn_implementation("eager")
        with torch.no_grad():
            model(_ids(12), use_cache=False)  # the stock model, as it came

    def test_lola_s_own_implementations_and_switches_run(self):
        """The training hybrid computes the same layers; stage 2's teacher passes switch to the
        stock attention on purpose (from lola's code): both run, the same switch by a caller
        does not."""
        from lola.linearize.finetuning import _teacher
        from lola.linearize.training_attention import HYBRID_ATTENTION, register_hybrid_attention

        model = _tiny_lola(lola.LoLAConfig(window=6, sparse_size=0, sinks=0, schedule="tokenwise", mixing="lolcats"))
        register_hybrid_attention()
        model.set_attn_implementation(HYBRID_ATTENTION)
        with torch.no_grad():
            model(_ids(12), use_cache=False)
            with _teacher(model, "sdpa"):
                model(_ids(12), use_cache=False)
            model.set_attn_implementation("sdpa")
            with pytest.raises(ValueError, match="attention implementation is now 'sdpa'"):
                model(_ids(12), use_cache=False)

    def test_a_lola_cache_layer_without_its_lola_module_is_refused(self):
        from lola.integrations.transformers import LoLACache

        model = _tiny_lola()
        del model.model.layers[1].self_attn.lola
        with torch.no_grad(), pytest.raises(ValueError, match="layer 1 has a LoLA cache layer but no LoLA module"):
            model(_ids(12), cache=LoLACache(model))


# -- cache files -----------------------------------------------------------------------------------


class TestCacheFiles:
    """``LoLACache.load`` bounds the lengths it reads; ``save`` removes only what its earlier
    ``cache.json`` names."""

    @pytest.mark.parametrize("length", [8193, 2**40], ids=["one-past-the-positions", "2**40"])
    def test_lengths_beyond_the_model_s_positions_are_refused_naming_the_file(self, tmp_path, length):
        from lola.integrations.transformers import LoLACache

        model = _saved_cache(tmp_path / "c")
        assert model.config.max_position_embeddings == 8192
        edit_cache(tmp_path / "c", meta=lambda m: m.update(cumulative_lengths=[30, length]))
        with pytest.raises(ValueError, match=r"c/cache.json: cumulative_lengths must be 2 integers from 0 to the model's max_position_embeddings \(8192\)"):
            LoLACache.load(tmp_path / "c", model)

    def test_lengths_up_to_the_model_s_positions_load(self, tmp_path):
        from lola.integrations.transformers import LoLACache

        model = _saved_cache(tmp_path / "c")
        edit_cache(tmp_path / "c", meta=lambda m: m.update(cumulative_lengths=[8192, 8192]))
        assert LoLACache.load(tmp_path / "c", model).get_seq_length() == 8192

    @pytest.mark.parametrize("beside", ["no-cache-json", "a-cache-json-naming-other-tensors"])
    def test_someone_s_cache_safetensors_is_kept(self, tmp_path, beside):
        folder = tmp_path / "c"
        if beside == "a-cache-json-naming-other-tensors":
            _saved_cache(folder)
        else:
            folder.mkdir()
        (folder / "cache.safetensors").write_bytes(b"not ours")
        _saved_cache(folder, lola.LoLAConfig(window=5, sparse_size=3, sinks=1, chunk=3))
        assert (folder / "cache.safetensors").read_bytes() == b"not ours"

    def test_the_legacy_tensors_an_earlier_cache_json_names_are_replaced(self, tmp_path):
        from lola.integrations.transformers import LoLACache

        folder = tmp_path / "c"
        _saved_cache(folder)
        named = json.loads((folder / "cache.json").read_text())["tensors"]
        (folder / named).rename(folder / "cache.safetensors")  # as the earlier format named it
        edit_cache(folder, meta=lambda m: m.update(tensors="cache.safetensors"))
        model = _saved_cache(folder)
        assert not (folder / "cache.safetensors").exists()
        LoLACache.load(folder, model)

    def test_a_cache_json_giving_a_key_twice_is_refused_naming_it(self, tmp_path):
        from lola.integrations.transformers import LoLACache

        model = _saved_cache(tmp_path / "c")
        text = (tmp_path / "c" / "cache.json").read_text()
        (tmp_path / "c" / "cache.json").write_text(text.replace('"format"', '"tensors": "elsewhere.safetensors",\n  "format"', 1))
        with pytest.raises(ValueError, match=r"cache.json is not valid JSON .*: key 'tensors' appears twice"):
            LoLACache.load(tmp_path / "c", model)


# -- the transformers integration's inputs --------------------------------------------------------


class TestTheIntegrationsInputs:
    """Flags are real bools; saved LoLA weights are finite; a sliding window matters only on the
    layers LoLA runs."""

    @pytest.mark.parametrize("force", ["no", 0, None], ids=["string", "int", "none"])
    def test_a_flag_that_is_not_a_bool_is_refused_naming_it(self, force):
        from lola.integrations.transformers import apply_lola, patch
        from lola.models import tiny_random

        model, _ = tiny_random()
        with pytest.raises(TypeError, match=rf"force must be True or False, got {type(force).__name__}"):
            apply_lola(model, CFG, force=force)
        with pytest.raises(TypeError, match="force must be True or False"):
            with patch(model, CFG, force=force):
                pass
        assert getattr(model, "_lola", None) is None

    def test_a_saved_model_with_infinite_lola_weights_is_refused_naming_tensor_and_file(self, tmp_path):
        from safetensors.torch import load_file, save_file

        from lola.integrations.transformers import from_pretrained

        _tiny_lola(lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, feature_map="hedgehog")).save_pretrained(tmp_path / "m")
        (path,) = (tmp_path / "m").glob("*.safetensors")
        tensors = load_file(path)
        name = sorted(k for k in tensors if ".lola." in k and tensors[k].is_floating_point())[-1]
        tensors[name] = tensors[name].clone()
        tensors[name].view(-1)[0] = float("inf")
        save_file(tensors, path, metadata={"format": "pt"})
        with pytest.raises(ValueError, match=rf"model.safetensors: LoLA weight '{re.escape(name)}' holds non-finite values"):
            from_pretrained(tmp_path / "m")

    @pytest.mark.parametrize(
        "layer_types, stock, refused",
        [
            (["sliding_attention", "full_attention", "sliding_attention"], [0, 2], None),
            (["sliding_attention", "full_attention", "sliding_attention"], [0], "layers [2]"),
            (None, [0, 1, 2], None),
            (None, [1], "layers [0, 2]"),
        ],
        ids=["every-sliding-layer-stock", "one-sliding-layer-run", "all-slide-all-stock", "all-slide-two-run"],
    )
    def test_a_binding_sliding_window_is_refused_only_on_layers_lola_runs(self, layer_types, stock, refused):
        from types import SimpleNamespace

        from lola.integrations.transformers.support import _sliding_window_reason

        config = SimpleNamespace(sliding_window=16, max_position_embeddings=4096, num_hidden_layers=3, layer_types=layer_types)
        reason = _sliding_window_reason(config, stock)
        assert reason is None if refused is None else refused in reason
