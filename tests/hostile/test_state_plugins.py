"""Hostile inputs, class ``state``: schedule and policy plug-ins and custom memory parts that
misbehave are named where they answer, never left to corrupt a state.

Schedules answer within their period and with token counts on every path that asks them
(``lola.engine.row_counts.ask_schedule`` / ``check_until``); a policy plug-in's failures and answers are
named by its registered name at the select step, tokens always outrank empty slots
(``SparseCache.select``), factory functions register, and options are strict numbers
(:func:`lola.policies.registry.options_schema`); ``LoLAMemory`` checks the parts it is given
where they are given.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

import lola
from lola.layer import compose
from tests.hostile.common import Case, layer, padded_mask, params, qkv, run_layer

transformers = pytest.importorskip("transformers")

# -- schedules answer within their period -----------------------------------------------------------


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


def _decode(attn, state, period: int = 4) -> None:
    """Decode one token at a time for a period: the schedule is asked at the first step (between
    steps the host counts down what it last answered)."""
    for seed in range(1, period + 1):
        run_layer(attn, tokens=1, batch=2, state=state, seed=seed)


class TestSchedulesAnswerWithinTheirPeriod:
    """``check_until``: every path that asks the schedule refuses an answer outside 1..period."""

    PATHS = ["attend-in-step", "attend-per-row", "decode-in-step", "decode-per-row"]

    @pytest.mark.parametrize("bad", [0, 5, -3], ids=["zero", "beyond-period", "negative"])
    @pytest.mark.parametrize("path", PATHS)
    def test_an_answer_outside_1_to_period_is_refused_naming_the_schedule(self, flaky, path, bad):
        attn = layer(lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=4, schedule="flaky_test"))
        mask = padded_mask() if path.endswith("per-row") else None
        if path.startswith("decode"):
            _, state = run_layer(attn, batch=2, mask=mask)
            flaky.bad, flaky.times = bad, 1
            call = functools.partial(_decode, attn, state)
        else:
            flaky.bad, flaky.times = bad, 1
            call = functools.partial(run_layer, attn, batch=2, mask=mask)
        with pytest.raises(ValueError, match=rf"schedule Flaky\(.*\) returned {bad} tokens until its step, expected 1\.\.4"):
            call()

    @pytest.mark.parametrize("path", PATHS)
    def test_an_early_step_is_within_the_period_and_runs(self, flaky, path):
        attn = layer(lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=4, schedule="flaky_test"))
        mask = padded_mask() if path.endswith("per-row") else None
        _, state = run_layer(attn, batch=2, mask=mask)
        flaky.bad, flaky.times = 1, 1  # a step after the next token: always allowed
        run_layer(attn, tokens=1 if path.startswith("decode") else 5, batch=2, state=state, seed=1)


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


# -- schedules answer with token counts -------------------------------------------------------------


class TestSchedulesAnswerWithTokenCounts:
    """``ask_schedule``: the one way the engine asks a schedule; a failure or an
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

        attn = layer(answering(later))
        mask = padded_mask() if path.endswith("per-row") else None
        if path.startswith("decode"):
            _, state = run_layer(attn, batch=2, mask=mask)
            calls["n"] = 101
            call = functools.partial(_decode, attn, state)
        else:
            call = functools.partial(run_layer, attn, batch=2, mask=mask)
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
    return run_layer(layer(cfg))[1]


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
        assert (run_layer(layer(cfg))[1].sparse.block.pos >= 0).all()

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


def test_a_policy_returning_nan_scores_is_refused():
    from lola.policies import register, unregister

    @dataclass(frozen=True)
    class NanScores:
        needs_attention = False

        def score(self, candidates, ctx):
            return torch.full(candidates.pos.shape, float("nan"))

    register("nan_scores_test", NanScores)
    try:
        attn = compose(lola.LoLAConfig(window=8, sparse_size=4, sinks=2, chunk=4, policy="nan_scores_test"), num_heads=4, head_dim=8, num_kv_heads=2)
        x = torch.randn(1, 40, 4, 8)
        with pytest.raises(ValueError, match="returned NaN scores for"):
            attn(x, x[:, :, :2], x[:, :, :2])
    finally:
        unregister("nan_scores_test")


def plugin_policy(name: str, score: Callable[[Any], Any]):
    """Register a plug-in policy ``name`` whose ``score`` answers ``score(candidates)``."""
    from lola.policies import register

    class Scorer:
        needs_attention = False

        def score(self, candidates, ctx):
            return score(candidates)

    register(name, Scorer, overwrite=True)
    return name


def run_policy(name: str) -> None:
    """A layer with the policy ``name`` over 20 tokens (several select steps)."""
    from lola.policies import unregister

    try:
        attn = layer(lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, policy=name))
        with torch.no_grad():
            attn(*qkv(1))
    finally:
        unregister(name)


def _register(*args, **kwargs):
    def run(tmp_path):
        from lola.policies import register, unregister

        try:
            register(*args, **kwargs)
        finally:
            if isinstance(args[0], str) and args[0] in lola.policies.available() and args[0] != "sre":
                unregister(args[0])

    return run


class _Keep:
    needs_attention = False

    def score(self, candidates, ctx):
        return candidates.pos.float()


def _answer(score):
    return lambda tmp_path: run_policy(plugin_policy("plugin_test_policy", score))


def _failing_factory(tmp_path):
    from lola.policies import register, unregister

    def factory():
        raise ValueError("needs a GPU")

    register("failing_factory_test", factory, overwrite=True)
    try:
        lola.LoLAConfig(policy="failing_factory_test")
    finally:
        unregister("failing_factory_test")


POLICIES = [
    Case("register under a number", _register(5, _Keep), (TypeError, ValueError), "name must be a non-empty string"),
    Case("register with overwrite='yes'", _register("flag_test", _Keep, overwrite="yes"), TypeError, "overwrite"),
    Case(
        "scores as complex numbers",
        _answer(lambda c: c.pos.to(torch.complex64)),
        TypeError,
        "plugin_test_policy.*complex",
    ),
    Case("scores as a list", _answer(lambda c: c.pos.float().tolist()), TypeError, "plugin_test_policy.*list"),
    Case("scores None", _answer(lambda c: None), TypeError, "plugin_test_policy.*NoneType"),
    Case("scores a scalar", _answer(lambda c: torch.tensor(1.0)), ValueError, "plugin_test_policy.*shape"),
    Case("scores with a leading axis", _answer(lambda c: c.pos.float()[None]), ValueError, "plugin_test_policy.*shape"),
    Case(
        "scores NaN for one candidate", _answer(lambda c: c.pos.float().masked_fill(c.pos == c.pos.amax(), float("nan"))), ValueError, "plugin_test_policy.*NaN"
    ),
    Case("a factory that fails", _failing_factory, ValueError, "failing_factory_test.*needs a GPU"),
]


# -- custom memory parts ------------------------------------------------------------------------------


def _memory(**parts):
    def run(tmp_path):
        from lola.memory import SlidingWindow, SparseCache
        from lola.policies import build
        from lola.schedules import build as schedule

        base = dict(window=SlidingWindow(6, 3), sparse=SparseCache(3), policy=build("sre"), schedule=schedule("chunkwise", chunk=3))
        lola.LoLAMemory(**{**base, **{k: (v() if callable(v) and not isinstance(v, type) else v) for k, v in parts.items()}})

    return run


def _parts(name, *args):
    def make():
        import lola.memory as memory

        return getattr(memory, name)(*args)

    return make


CUSTOM_MEMORY = [
    Case("a schedule given by name", _memory(schedule="chunkwise"), TypeError, "schedule must implement"),
    Case("a policy given by name", _memory(policy="sre"), TypeError, "policy must implement"),
    Case("a policy without score", _memory(policy=object()), TypeError, "policy must implement"),
    Case("a sparse cache of negative size", _memory(sparse=_parts("SparseCache", -1)), ValueError, "size|capacity"),
    Case("a window of negative size", _memory(window=_parts("SlidingWindow", -1, 3)), ValueError, "size|window"),
    Case("sinks of negative size", _memory(sinks=_parts("SinkTokens", -2)), ValueError, "capacity must be >= 0"),
    Case("a window given a sparse cache", _memory(window=_parts("SparseCache", 3)), TypeError, "window"),
    Case("a layer index as a string", _memory(layer="0"), TypeError, "layer must be an int"),
]


@pytest.mark.parametrize("case", params(POLICIES + CUSTOM_MEMORY))
def test_an_api_input_is_refused_naming_it(case, tmp_path):
    with pytest.raises(case.error, match=case.match):
        case.run(tmp_path)
