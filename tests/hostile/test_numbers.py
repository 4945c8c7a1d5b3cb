"""Hostile inputs, class 5 (numbers): every numeric option is finite and within bounds, checked
by the schema that owns it, and memory is checked before it is allocated.

Mechanisms: every pydantic schema of lola sets ``allow_inf_nan=False`` (tested here field by
field, found by introspection, so a new float field is covered without a new test); policy
options are validated by each policy's own schema (:func:`lola.policies.registry.options_schema`);
sizes have bounds (:mod:`lola.limits`); and a layer's state is checked against the free memory
before it is allocated (:func:`lola.memory.allocation.check_allocation`).
"""

from __future__ import annotations

import json
import math
import typing

import pytest
import torch
from pydantic import BaseModel, ValidationError

import lola
from lola.cli import main

transformers = pytest.importorskip("transformers")


def _schemas() -> list[type[BaseModel]]:
    from lola.budgets import HeadBudgets
    from lola.eval.perplexity import PerplexityRun
    from lola.eval.runner import NiahRun
    from lola.linearize.finetuning import FinetuneConfig
    from lola.linearize.transfer import LinearizeConfig
    from lola.pretrained.lora import LoraSpec

    return [lola.LoLAConfig, LinearizeConfig, FinetuneConfig, NiahRun, PerplexityRun, HeadBudgets, LoraSpec]


def _has_float(annotation) -> bool:
    if annotation is float:
        return True
    return any(_has_float(a) for a in typing.get_args(annotation))


FLOAT_FIELDS = [(schema, name) for schema in _schemas() for name, f in schema.model_fields.items() if _has_float(f.annotation)]


def test_the_float_fields_were_found():
    found = {(s.__name__, n) for s, n in FLOAT_FIELDS}
    assert {("LoLAConfig", "scale"), ("LinearizeConfig", "lr"), ("FinetuneConfig", "lr"), ("HeadBudgets", "power"), ("LoraSpec", "alpha")} <= found


@pytest.mark.parametrize("schema, field", FLOAT_FIELDS, ids=[f"{s.__name__}.{n}" for s, n in FLOAT_FIELDS])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_every_float_field_of_every_schema_refuses_non_finite_values(schema, field, value):
    with pytest.raises(ValidationError) as err:
        schema.model_validate({field: value})
    assert any(e["loc"][:1] == (field,) or field in map(str, e["loc"]) for e in err.value.errors()), err.value


def _policy_float_options() -> list[tuple[str, str]]:
    from lola.policies.registry import available, get, options_schema

    out = []
    for name in available():
        schema = options_schema(get(name))
        if schema is None:
            continue
        out += [(name, option) for option, f in schema.model_fields.items() if _has_float(f.annotation)]
    return out


POLICY_FLOATS = _policy_float_options()


def test_policy_float_options_were_found():
    assert {("sre", "eps"), ("expected_attention", "query_half_life"), ("expected_attention", "rope_theta"), ("fusion", "weights")} <= set(POLICY_FLOATS)


@pytest.mark.parametrize("policy, option", POLICY_FLOATS, ids=[f"{p}.{o}" for p, o in POLICY_FLOATS])
@pytest.mark.parametrize("value", [math.inf, math.nan], ids=["inf", "nan"])
def test_policy_options_refuse_non_finite_values_naming_them(policy, option, value):
    from lola.policies.registry import build

    given = [1.0, value] if option == "weights" else value
    extra = {"policies": ["sre", "key_norm"]} if option == "weights" else {}
    with pytest.raises(ValueError, match=rf"policy '{policy}' options: {option}"):
        build(policy, **extra, **{option: given})
    with pytest.raises(ValidationError, match=option):  # through the config, as a user writes it
        lola.LoLAConfig(policy=policy, policy_kwargs={**extra, option: given})


@pytest.mark.parametrize(
    "policy, options, fragment",
    [
        ("expected_attention", {"horizon": 10**9}, "horizon: Input should be less than or equal to"),
        ("expected_attention", {"horizon": 0}, "horizon: Input should be greater than or equal to 1"),
        ("expected_attention", {"query_half_life": 0.0}, "query_half_life: Input should be greater than 0"),
        ("expected_attention", {"rope_theta": -1.0}, "rope_theta"),
        ("sre", {"eps": 0.0}, "eps: Input should be greater than 0"),
        ("random", {"seed": "not a number"}, "seed"),
        ("value_weighted", {"policy_kwargs": "sre"}, "policy_kwargs"),
    ],
)
def test_policy_options_out_of_bounds_are_refused(policy, options, fragment):
    from lola.policies.registry import build

    with pytest.raises(ValueError, match=fragment):
        build(policy, **options)


def test_an_option_the_policy_does_not_take_is_a_type_error():
    from lola.policies.registry import build

    with pytest.raises(TypeError, match="policy 'sre' options: epsilon: Extra inputs are not permitted"):
        build("sre", epsilon=1e-6)
    with pytest.raises(ValidationError, match="epsilon"):
        lola.LoLAConfig(policy="sre", policy_kwargs={"epsilon": 1e-6})


def test_a_huge_horizon_costs_nothing_more():
    """The average rotation is in closed form: a horizon of millions allocates no [horizon, D] table."""
    from lola.policies.predictive import average_rope_rotation

    d, theta = 64, 10000.0
    for n in (1, 7, 512):
        half = d // 2
        freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / d)
        angle = torch.arange(1, n + 1, dtype=torch.float64)[:, None] * freq
        r = average_rope_rotation(d, theta, n).double()
        torch.testing.assert_close(r.diagonal()[:half], angle.cos().mean(0), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r[torch.arange(half) + half, torch.arange(half)], angle.sin().mean(0), rtol=1e-5, atol=1e-6)
    assert torch.isfinite(average_rope_rotation(d, theta, 2**24)).all()


# --- memory, before allocating ----------------------------------------------------------------


@pytest.mark.parametrize(
    "config, named",
    [
        (lola.LoLAConfig(window=2**24), "window 16777"),
        (lola.LoLAConfig(sparse_size=2**24), "sparse 16777216"),
        (lola.LoLAConfig(sinks=2**24), "sinks 16777216"),
        (lola.LoLAConfig(feature_dim=2**14, feature_map="hedgehog"), "a 32768×64 linear state per head, batch 16"),
    ],
)
def test_a_state_that_cannot_fit_is_refused_before_allocating(config, named, monkeypatch):
    from lola.layer import compose
    from lola.memory import allocation

    monkeypatch.setattr(allocation, "available_bytes", lambda device: 256 * 2**20)  # 256 MiB free
    attn = compose(config, num_heads=4, head_dim=64, num_kv_heads=2)
    x = torch.randn(16, 4, 4, 64)  # a batch of 16
    state = attn.new_state()
    with pytest.raises(MemoryError, match=rf"{named}.*needs .* GiB on cpu, but only 0.25 GiB is free"):
        attn(x, x[:, :, :2], x[:, :, :2], state=state)
    assert not state.allocated


def test_a_state_that_fits_is_allocated(monkeypatch):
    from lola.layer import compose
    from lola.memory import allocation

    monkeypatch.setattr(allocation, "available_bytes", lambda device: 256 * 2**20)
    attn = compose(lola.LoLAConfig(window=64, sparse_size=64), num_heads=4, head_dim=64, num_kv_heads=2)
    x = torch.randn(2, 4, 4, 64)
    state = attn.new_state()
    attn(x, x[:, :, :2], x[:, :, :2], state=state)
    assert state.allocated


def test_check_allocation_compares_with_the_free_memory():
    from lola.memory.allocation import available_bytes, check_allocation

    check_allocation(10, torch.device("cpu"), "x", available=10)
    with pytest.raises(MemoryError, match="x needs"):
        check_allocation(11, torch.device("cpu"), "x", available=10)
    free = available_bytes(torch.device("cpu"))
    assert free is None or free > 0


@pytest.mark.parametrize("key, value", [("num_layers", 10**9), ("num_heads", 10**9), ("head_dim", 10**9), ("num_kv_heads", 10**7)])
def test_a_maps_description_with_a_huge_geometry_is_refused_at_once(key, value, tmp_path):
    from lola.pretrained.folder import read_feature_maps
    from tests.hostile.common import write_random_maps as _write

    _write(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "lola_config.json").read_text())
    meta["geometry"][key] = value
    (tmp_path / "m" / "lola_config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"geometry.{key} must be <= "):
        read_feature_maps(tmp_path / "m")


# --- the commands -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["calibrate", "--model", "tiny-random-llama", "--power", "inf"], "--power: Input should be a finite number"),
        (["calibrate", "--model", "tiny-random-llama", "--power", "nan"], "--power: Input should be a finite number"),
        (["calibrate", "--model", "tiny-random-llama", "--power", "-1"], "--power: Input should be greater than or equal to 0"),
        (["linearize", "--quick", "--lr", "inf"], "--lr: Input should be a finite number"),
        (["linearize", "--quick", "--lr", "nan"], "lr"),
        (["linearize", "--quick", "--lora-lr", "inf"], "--lora-lr: Input should be a finite number"),
        (["linearize", "--quick", "--maps-lr", "nan"], "--maps-lr: Input should be a finite number"),
    ],
)
def test_commands_refuse_non_finite_numbers_before_loading(argv, fragment, tmp_path, capsys, no_model, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--out", str(tmp_path / ("o.json" if argv[0] in ("calibrate", "perplexity") else "o"))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.json").exists()


def test_budgets_allocate_refuses_a_non_finite_power():
    from lola.budgets import allocate

    for power in (math.inf, math.nan, -0.5, True):
        with pytest.raises(ValueError, match="power must be a finite number"):
            allocate(torch.ones(2, 2), 4, power=power)
