"""Hostile inputs, class ``numbers``: every number lola takes is finite, of its kind and within
bounds, checked by the schema or the function that owns it, and memory is checked before it is
allocated.

Mechanisms: every pydantic schema of lola sets ``allow_inf_nan=False`` and strict types (tested
here field by field, found by introspection, so a new float field is covered without a new
test); ``compose`` checks its geometry; policy options are validated by each policy's own schema
(:func:`lola.policies.registry.options_schema`); sizes, seeds and lengths have bounds
(:mod:`lola.limits`, the model's positions); and a layer's state is checked against the free
memory, and the process's address-space limit, before it is allocated
(:func:`lola.memory.allocation.check_allocation`).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import typing

import pytest
import torch
from pydantic import BaseModel, ValidationError

import lola
from lola.cli import main
from lola.config import MAX_TOKENS
from lola.eval.runner import NiahRun
from lola.layer import compose
from tests.hostile.common import FULL_NIAH, GOOD_BUDGETS, RUN, refused, snapshot, tiny_lola, write_random_maps

transformers = pytest.importorskip("transformers")


# -- configs and schemas ---------------------------------------------------------------------------


def _schemas() -> list[type[BaseModel]]:
    """Every pydantic schema lola defines, found by walking its modules (a new one is covered
    without a new test); the vLLM plug-in's modules need vLLM and hold none."""
    import importlib
    import inspect
    import pkgutil

    found: dict[str, type[BaseModel]] = {}
    for info in pkgutil.walk_packages(lola.__path__, "lola."):
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, BaseModel) and obj.__module__.startswith("lola."):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


def _has(annotation, kinds: tuple[type, ...]) -> bool:
    if annotation in kinds:
        return True
    return any(_has(a, kinds) for a in typing.get_args(annotation))


SCHEMAS = _schemas()
FLOAT_FIELDS = [(schema, name) for schema in SCHEMAS for name, f in schema.model_fields.items() if _has(f.annotation, (float,))]
NUMBER_FIELDS = [(schema, name) for schema in SCHEMAS for name, f in schema.model_fields.items() if _has(f.annotation, (float, int))]


def test_the_schemas_and_their_number_fields_were_found():
    found = {(s.__name__, n) for s, n in FLOAT_FIELDS}
    assert {("LoLAConfig", "scale"), ("LinearizeConfig", "lr"), ("FinetuneConfig", "lr"), ("HeadBudgets", "power"), ("LoraSpec", "alpha")} <= found
    assert {("CalibrateSpec", "power"), ("FitSpec", "ridge"), ("ReadDefaults", "linear_share_cap"), ("LoLAConfig", "linear_decay")} <= found
    assert {("LoraSpec", "rank"), ("NiahRun", "samples"), ("LoLAConfig", "window")} <= {(s.__name__, n) for s, n in NUMBER_FIELDS}


@pytest.mark.parametrize("schema, field", FLOAT_FIELDS, ids=[f"{s.__name__}.{n}" for s, n in FLOAT_FIELDS])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_every_float_field_of_every_schema_refuses_non_finite_values(schema, field, value):
    with pytest.raises(ValidationError) as err:
        schema.model_validate({field: value})
    assert any(e["loc"][:1] == (field,) or field in map(str, e["loc"]) for e in err.value.errors()), err.value


@pytest.mark.parametrize("schema, field", NUMBER_FIELDS, ids=[f"{s.__name__}.{n}" for s, n in NUMBER_FIELDS])
@pytest.mark.parametrize("value", [True, False])
def test_no_number_field_reads_a_boolean_as_a_number(schema, field, value):
    # linear_decay=True was read as 1.0: a flag given where a number belongs is a mistake to name.
    with pytest.raises(ValidationError) as err:
        schema.model_validate({field: value})
    assert any(e["loc"][:1] == (field,) or field in map(str, e["loc"]) for e in err.value.errors()), err.value


BAD_CONFIGS = [
    ({"window": True}, "window"),
    ({"sinks": False}, "sinks"),
    ({"sparse_size": True}, "sparse_size"),
    ({"chunk": True}, "chunk"),
    ({"feature_dim": True}, "feature_dim"),
    ({"window": "64"}, "window"),
    ({"window": 64.0}, "window"),
    ({"window": -1}, "window"),
    ({"window": 10**12}, "window"),
    ({"sparse_size": MAX_TOKENS + 1}, "sparse_size"),
    ({"sinks": 10**9}, "sinks"),
    ({"chunk": 10**12}, "chunk"),
    ({"feature_dim": 10**9}, "feature_dim"),
    ({"scale": float("inf")}, "scale"),
    ({"scale": float("nan")}, "scale"),
    ({"scale": True}, "scale"),
    ({"window_factor_init": float("nan")}, "window_factor_init"),
    ({"window_factor_init": float("-inf")}, "window_factor_init"),
    ({"window_factor_init": True}, "window_factor_init"),
    ({"affine": 1}, "affine"),
    ({"check_inputs": "yes"}, "check_inputs"),
    ({"window_per_head": [True, 3]}, "window_per_head"),
    ({"sparse_size_per_head": [1.5]}, "sparse_size_per_head"),
    ({"sparse_size_per_head": [10**12]}, "sparse_size_per_head"),
    ({"full_attention_layers": [True]}, "layer indices"),
    ({"layer_overrides": [5]}, r"layer_overrides\[0\] must be a mapping"),
    ({"layer_overrides": {0: 5}}, "layer_overrides"),
    ({"layer_overrides": {0: {"nope": 1}}}, "nope"),
    ({"layer_overrides": {0: {"window": True}}}, r"layer_overrides\[0\]: window"),
    ({"layer_overrides": {1: {"scale": float("nan")}}}, r"layer_overrides\[1\]: scale"),
    ({"layer_overrides": {True: {"window": 3}}}, "layer indices"),
    ({"policy": 5}, "policy"),
    ({"policy_kwargs": {"nope": 1}}, "policy_kwargs"),
]


@pytest.mark.parametrize("kwargs, match", BAD_CONFIGS, ids=[str(k) for k, _ in BAD_CONFIGS])
def test_bad_config_is_refused_naming_the_field(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        lola.LoLAConfig(**kwargs)


def test_config_bounds_and_json_keys_still_accept_sane_values():
    cfg = lola.LoLAConfig(window=MAX_TOKENS, sparse_size=0, chunk=1, scale=1, layer_overrides={"1": {"window": 3}})
    assert cfg.window == MAX_TOKENS and cfg.scale == 1.0 and cfg.for_layer(1).window == 3
    assert lola.LoLAConfig.model_validate_json(cfg.model_dump_json()) == cfg


@pytest.mark.parametrize("scale", [1e300, 1e4, 1001.0])
def test_the_attention_scale_is_bounded(scale):
    from pydantic import ValidationError

    import lola

    with pytest.raises(ValidationError, match="scale"):
        lola.LoLAConfig(scale=scale)
    assert lola.LoLAConfig(scale=0.125).scale == 0.125


# -- compose and the layer's parameters ------------------------------------------------------------


CFG = lola.LoLAConfig(window=4, sparse_size=4, sinks=0, chunk=4)


BAD_GEOMETRY = [
    ({"num_heads": 2.5, "head_dim": 8}, TypeError, r"num_heads must be an int >= 1, got 2\.5 \(float\)"),
    ({"num_heads": True, "head_dim": 8}, TypeError, r"num_heads .* got True \(bool\)"),
    ({"num_heads": "4", "head_dim": 8}, TypeError, "num_heads"),
    ({"num_heads": 0, "head_dim": 8}, ValueError, "num_heads"),
    ({"num_heads": 4, "head_dim": 8.0}, TypeError, "head_dim"),
    ({"num_heads": 4, "head_dim": 0}, ValueError, "head_dim"),
    ({"num_heads": 4, "head_dim": 8, "num_kv_heads": 3}, ValueError, r"multiple of num_kv_heads \(3\)"),
    ({"num_heads": 4, "head_dim": 8, "num_kv_heads": 2.0}, TypeError, "num_kv_heads"),
    ({"num_heads": 4, "head_dim": 8, "num_kv_heads": 0}, ValueError, "num_kv_heads"),
    ({"num_heads": 4, "head_dim": 8, "layer": -1}, ValueError, "layer"),
    ({"num_heads": 4, "head_dim": 8, "layer": 1.5}, TypeError, "layer"),
]


@pytest.mark.parametrize("kwargs, error, match", BAD_GEOMETRY, ids=[str(k) for k, _, _ in BAD_GEOMETRY])
def test_compose_refuses_bad_geometry(kwargs, error, match):
    with pytest.raises(error, match=match):
        lola.compose(CFG, **kwargs)


@pytest.mark.parametrize("name", ["feature_map_q.mlp.layer", "feature_map_k.mlp.layer", "window_factors"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_parameters_are_refused_when_a_sequence_starts(name, value):
    attn = lola.compose(lola.LoLAConfig(feature_map="hedgehog", feature_dim=8), num_heads=2, head_dim=4)
    x = torch.randn(1, 6, 2, 4)
    attn(x, x, x)  # finite: runs
    with torch.no_grad():
        dict(attn.named_parameters())[name].view(-1)[0] = value
    state = attn.new_state()
    with pytest.raises(ValueError, match=re.escape(f"LoLA layer parameter(s) {name} hold non-finite values")):
        attn(x, x, x, state=state)
    assert not state.allocated


@pytest.mark.parametrize("eps", [0.0, -1e-6, float("nan"), float("inf"), "1e-6"])
def test_a_hedgehog_floor_that_is_not_finite_and_positive_is_refused(eps):
    from lola.feature_maps.hedgehog import HedgehogFeatureMap

    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        HedgehogFeatureMap(num_heads=2, head_dim=4, feature_dim=8, eps=eps)


def test_a_saved_model_with_infinite_lola_weights_is_refused_naming_tensor_and_file(tmp_path):
    from safetensors.torch import load_file, save_file

    from lola.integrations.transformers import from_pretrained

    tiny_lola(lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, feature_map="hedgehog")).save_pretrained(tmp_path / "m")
    (path,) = (tmp_path / "m").glob("*.safetensors")
    tensors = load_file(path)
    name = sorted(k for k in tensors if ".lola." in k and tensors[k].is_floating_point())[-1]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("inf")
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"model.safetensors: LoLA weight '{re.escape(name)}' holds non-finite values"):
        from_pretrained(tmp_path / "m")


# -- policy options --------------------------------------------------------------------------------


def _policy_float_options() -> list[tuple[str, str]]:
    from lola.policies.registry import available, get, options_schema

    out = []
    for name in available():
        schema = options_schema(get(name))
        if schema is None:
            continue
        out += [(name, option) for option, f in schema.model_fields.items() if _has(f.annotation, (float,))]
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


# -- training configs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema, field, value",
    [
        ("LinearizeConfig", "batch", True),
        ("LinearizeConfig", "chunk_tokens", 64.0),
        ("LinearizeConfig", "lr", True),
        ("LinearizeConfig", "seed", -(2**63) - 1),
        ("LinearizeConfig", "seed", 2**63),
        ("FinetuneConfig", "seq_len", 64.0),
        ("FinetuneConfig", "warmup_steps", False),
        ("FinetuneConfig", "kl_weight", True),
        ("FinetuneConfig", "seed", 2**80),
    ],
)
def test_training_config_numbers_are_strict(schema, field, value):
    from lola import linearize

    with pytest.raises(ValueError, match=field):
        getattr(linearize, schema)(**{field: value})


def test_training_config_floats_still_take_ints():
    from lola.linearize import FinetuneConfig, LinearizeConfig

    assert LinearizeConfig(lr=1).lr == 1.0 and FinetuneConfig(lora_alpha=8).lora_alpha == 8.0
    assert LinearizeConfig(seed=2**63 - 1).seed == 2**63 - 1


# -- memory, before allocating ---------------------------------------------------------------------


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
    from lola.memory import allocation

    monkeypatch.setattr(allocation, "available_bytes", lambda device: 256 * 2**20)  # 256 MiB free
    attn = compose(config, num_heads=4, head_dim=64, num_kv_heads=2)
    x = torch.randn(16, 4, 4, 64)  # a batch of 16
    state = attn.new_state()
    with pytest.raises(MemoryError, match=rf"{named}.*needs .* GiB on cpu, but only 0.25 GiB is free"):
        attn(x, x[:, :, :2], x[:, :, :2], state=state)
    assert not state.allocated


def test_a_state_that_fits_is_allocated(monkeypatch):
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="address-space limits are read from /proc")
def test_the_memory_check_sees_the_address_space_limit():
    """Under ``ulimit -v`` a state beyond the limit is refused by name, not an allocator crash."""
    code = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, resource.RLIM_INFINITY))
import torch
from lola.memory.allocation import available_bytes, check_allocation
free = available_bytes("cpu")
assert free is not None and free < 6 * 2**30, free
try:
    check_allocation(8 * 2**30, torch.device("cpu"), "window 16777216 x 64 heads")
except MemoryError as err:
    assert "window 16777216" in str(err) and "GiB" in str(err), err
else:
    raise SystemExit("not refused")
"""
    subprocess.run([sys.executable, "-c", code], check=True)


# -- files: feature-map descriptions, budgets, texts -----------------------------------------------


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


@pytest.mark.parametrize(
    "field,value",
    [
        ("uniform_sparse_size", True),
        ("uniform_sparse_size", 2.0),
        ("sparse_size_per_head", [[4.0, 2], [2, 0]]),
        ("sparse_size_per_head", [[True, 2], [2, 0]]),
        ("scores", [[2.0, -1.0], [1.0, 0.0]]),
        ("power", False),
        ("sparse_size_per_head", [[2**25, 0], [0, 0]]),
    ],
)
def test_budgets_files_are_strict(field, value, tmp_path):
    from lola import budgets

    path = tmp_path / "b.json"
    path.write_text(json.dumps({**GOOD_BUDGETS, field: value}))
    with pytest.raises(ValueError, match=rf"b.json is not a valid budgets file: {field}"):
        budgets.load(path)
    path.write_text(json.dumps(GOOD_BUDGETS))
    assert budgets.load(path).num_layers == 2  # the good one loads


def test_budgets_allocate_refuses_a_non_finite_power():
    from lola.budgets import allocate

    for power in (math.inf, math.nan, -0.5, True):
        with pytest.raises(ValueError, match="power must be a finite number"):
            allocate(torch.ones(2, 2), 4, power=power)


def test_a_text_too_large_to_read_whole_is_refused_by_name(tmp_path):
    from lola.data.text import MAX_TEXT_BYTES, read_text_file

    path = tmp_path / "huge.txt"
    with open(path, "wb") as f:  # sparse: no disk used
        f.truncate(MAX_TEXT_BYTES + 1)
    with pytest.raises(ValueError, match=r"huge.txt.*GiB"):
        read_text_file(path)


# -- the commands' options -------------------------------------------------------------------------


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


@pytest.mark.parametrize("option,value", [("--sparse-size", str(2**25)), ("--floor", "300"), ("--length", str(2**25))])
def test_calibrate_sizes_are_bounded_before_the_model_loads(option, value, tmp_path, capsys, no_model):
    refused(capsys, ["calibrate", "--model", "tiny-random-llama", "--out", str(tmp_path / "b.json"), option, value], option)


@pytest.mark.parametrize("seed", [-(2**63) - 5, 2**63, 2**100, True, 1.0])
def test_seeds_are_bounded_for_demo_and_niah(seed):
    from lola.eval.demo import check_demo_args

    with pytest.raises(ValueError, match="--seed"):
        check_demo_args(64, 1, 16, prefix="--", seed=seed)
    with pytest.raises(ValueError, match="seed"):
        RUN.model_validate({**RUN.model_dump(), "seed": seed})


@pytest.mark.parametrize(
    "length, trials, fragment",
    [(2**14 + 1, 1, "--length must be <= 16384"), (2**24, 1, "--length"), (2**40, 8, "--length"), (2048, 10**7, "--trials must be <= 1000000")],
)
def test_demo_sizes_are_bounded(length, trials, fragment):
    from lola.eval.demo import MAX_LENGTH, check_demo_args

    with pytest.raises(ValueError, match=fragment):
        check_demo_args(length, trials, 64, prefix="--")
    check_demo_args(MAX_LENGTH, 1, 64)  # the bound itself runs


@pytest.mark.parametrize("arg,value", [("batch_size", -2), ("batch_size", "many"), ("max_length", 0), ("max_batch_size", 1.5), ("max_length", True)])
def test_lm_eval_sizes_are_checked_before_hflm_sees_them(arg, value):
    from lola.integrations.lm_eval.model import _check_hflm_sizes

    with pytest.raises(ValueError, match=f"model_args {arg} must be"):
        _check_hflm_sizes({arg: value})
    ok = {"batch_size": "auto:4", "max_length": "512", "max_batch_size": 8.0}
    _check_hflm_sizes(ok)
    assert ok == {"batch_size": "auto:4", "max_length": 512, "max_batch_size": 8}


# -- lengths against the model's positions ---------------------------------------------------------


def test_max_positions_is_read_without_loading(tmp_path):
    from lola.models import max_positions

    assert max_positions("tiny-random-llama") == 8192 and max_positions("smollm2-135m-instruct") == 8192
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 2048}')
    assert max_positions(tmp_path) == 2048
    assert max_positions(tmp_path / "nothing") is None


def test_length_beyond_the_models_positions_is_refused_before_generating(tmp_path, capsys, scripted_model):
    _, calls = scripted_model
    out = tmp_path / "o"
    refused(capsys, [*FULL_NIAH, "--lengths", "100000", "--out", str(out)], "length 100000 exceeds what the model can hold (8192 positions)")
    assert not calls and not out.exists()


def test_export_niah_refuses_lengths_beyond_the_model_s_positions(tmp_path, capsys):
    from lola.integrations.lm_eval.__main__ import export_main

    assert export_main(["--out", str(tmp_path / "t"), "--model", "tiny-random-llama", "--lengths", "512", "8193", "--samples", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("export-niah: error: --lengths: 8193") and "8192 positions" in err and not (tmp_path / "t").exists()


def test_perplexity_refuses_generation_past_the_model_positions():
    from lola.eval.perplexity import PerplexityRun, run_perplexity
    from lola.models import tiny_random

    model, tok = tiny_random()
    limit = model.config.max_position_embeddings
    run = PerplexityRun(lengths=[128], methods=["full"], generate=limit - 100)
    with pytest.raises(ValueError, match=f"--generate {limit - 100} .* give --generate at most {limit - 128}"):
        run_perplexity(run, model, tok, progress=False)


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"lengths": [300, 100], "max_new_tokens": 100}, "max_new_tokens"),
        ({"lengths": [500], "max_new_tokens": 4096}, "max_new_tokens"),
        ({"task": "vt", "lengths": [64]}, "max_new_tokens unset"),  # the task's default answer length
    ],
    ids=["equal to the shortest", "beyond the only length", "the default of vt"],
)
def test_max_new_tokens_must_leave_room_for_a_prompt(options, fragment):
    with pytest.raises(ValueError, match=fragment):
        NiahRun(**options)


def test_lola_niah_names_max_new_tokens_before_loading(capsys, no_model):
    refused(capsys, ["niah", "--lengths", "256", "--max-new-tokens", "256"], "--max-new-tokens", "shortest of lengths [256]")


def test_a_prompt_that_does_not_fit_names_max_new_tokens_and_the_length():
    from lola.eval.niah import make_sample
    from lola.models import tiny_random

    _, tok = tiny_random()
    with pytest.raises(ValueError, match=r"length 120 is too short .* max_new_tokens 90"):
        make_sample(tok, "niah_single_1", 120, 0.5, seed=0, max_new_tokens=90)


def _short_model():
    """The tiny random Llama, claiming 64 positions."""
    from lola.models import tiny_random

    model, tok = tiny_random()
    model.config.max_position_embeddings = 64
    return model, tok


@pytest.mark.parametrize("tokens", [65, 96, 4096])
def test_stage1_chunks_beyond_the_positions_are_refused(tokens, tmp_path):
    from lola.linearize import LinearizeConfig, linearize

    model, tok = _short_model()
    cfg = LinearizeConfig(steps=1, chunk_tokens=tokens, train_chunks=1, eval_chunks=1, window=8, text=["pydoc"], device="cpu")
    with pytest.raises(ValueError, match=rf"chunk_tokens \(--chunk-tokens\) {tokens} is longer than the model's 64 positions"):
        linearize(model, tok, cfg, tmp_path / "lin", progress=False, log=lambda s: None)
    assert not (tmp_path / "lin").exists()  # refused before anything was written


@pytest.mark.parametrize("tokens", [65, 512])
def test_stage2_sequences_beyond_the_positions_are_refused(tokens, tmp_path):
    from lola.linearize import FinetuneConfig, finetune

    write_random_maps(tmp_path / "lin")
    before = snapshot(tmp_path / "lin")
    model, tok = _short_model()
    cfg = FinetuneConfig(steps=1, seq_len=tokens, eval_chunks=1, text=["pydoc"], device="cpu")
    with pytest.raises(ValueError, match=rf"seq_len \(--chunk-tokens\) {tokens} is longer than the model's 64 positions"):
        finetune(model, tok, cfg, tmp_path / "lin", progress=False, log=lambda s: None)
    assert snapshot(tmp_path / "lin") == before


def test_a_held_out_text_shorter_than_a_window_names_the_text_and_the_tokens(tmp_path):
    from lola.eval.perplexity import PerplexityRun, run_perplexity
    from lola.models import tiny_random

    small = tmp_path / "notes.txt"
    small.write_text("A short note. " * 60)
    model, tok = tiny_random()
    run = PerplexityRun(lengths=[96], methods=["full"], windows=1, generate=0, text=[str(small)])
    with pytest.raises(ValueError, match=rf"--text {small}: its held-out part .* fewer than one window of --lengths 96; give a text of about 960 tokens"):
        run_perplexity(run, model, tok, progress=False)


def test_export_pretrained_refuses_a_vllm_flag_that_is_not_a_bool(tmp_path):
    from lola.integrations.transformers.export import export_pretrained

    with pytest.raises(TypeError, match=r"vllm must be True or False, got 'false'"):
        export_pretrained(None, None, tmp_path / "e", vllm="false")
