"""Hostile inputs, class 6 (inputs that should be refused): nothing is cast, guessed or dropped.

- text that is not text: a haystack or training text with NUL bytes, or not UTF-8, is refused
  naming the file (:func:`lola.data.text.read_text_file`, the one reader of user text files);
- names and flags: lm-eval model_args are parsed, not cast (``apply_lola=no``), and typos are
  refused with the close name; a layer named twice in ``layer_overrides`` is refused;
- tensors: feature-map and LoRA tensors must be floats, one per name (no second copy under
  another prefix), and adapters never reach a layer kept as stock attention;
- lengths: ``calibrate`` refuses a length beyond the model's positions.
"""

from __future__ import annotations

import pytest
import torch

from lola.cli import main

transformers = pytest.importorskip("transformers")

NOT_TEXT = {
    "nul bytes": b"needle \x00\x01\x02 haystack " * 50,
    "latin-1": "caf\xe9 cr\xe8me br\xfbl\xe9e ".encode("latin-1") * 200,
    "utf-16": "The grass is green. ".encode("utf-16") * 50,
    "png": b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8,
}


@pytest.mark.parametrize("kind", sorted(NOT_TEXT))
def test_niah_refuses_a_haystack_that_is_not_text(kind, tmp_path, capsys, no_model):
    hay = tmp_path / "hay.bin"
    hay.write_bytes(NOT_TEXT[kind])
    argv = ["niah", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "1", "--haystack-file", str(hay), "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hay.bin" in err and ("binary" in err or "not UTF-8" in err), err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("kind", sorted(NOT_TEXT))
def test_training_text_that_is_not_text_is_refused(kind, tmp_path):
    from lola.data.text import load_documents, read_text_file

    f = tmp_path / "t.txt"
    f.write_bytes(NOT_TEXT[kind])
    with pytest.raises(ValueError, match=r"t.txt.*(binary|not UTF-8)"):
        read_text_file(f)
    with pytest.raises(ValueError, match=r"t.txt.*(binary|not UTF-8)"):
        load_documents([str(f)])


@pytest.mark.parametrize("kind", sorted(NOT_TEXT))
def test_the_lm_eval_export_refuses_a_haystack_that_is_not_text(kind, tmp_path):
    from lola.integrations.lm_eval.niah import export_niah
    from lola.models import tiny_random

    hay = tmp_path / "hay.bin"
    hay.write_bytes(NOT_TEXT[kind])
    _, tok = tiny_random()
    with pytest.raises(ValueError, match=r"hay.bin.*(binary|not UTF-8)"):
        export_niah(tmp_path / "tasks", tok, lengths=[512], samples=1, haystack_file=hay)
    assert not (tmp_path / "tasks").exists()


# --- names and flags that must not be guessed -------------------------------------------------


@pytest.mark.parametrize(
    "value, expected", [("true", True), ("False", False), ("no", False), ("YES", True), ("0", False), ("1", True), (True, True), (False, False)]
)
def test_lm_eval_flags_are_parsed_not_cast(value, expected):
    from lola.integrations.lm_eval.model import parse_flag

    assert parse_flag("apply_lola", value) is expected


@pytest.mark.parametrize("value", ["nope", "2", "", "none"])
def test_lm_eval_flags_that_are_not_booleans_are_refused(value):
    from lola.integrations.lm_eval.model import parse_flag

    with pytest.raises(ValueError, match="apply_lola must be true or false"):
        parse_flag("apply_lola", value)


@pytest.mark.parametrize(
    "args, registered, fragment",
    [
        ({"batch_sise": 4}, False, "did you mean 'batch_size'"),
        ({"windows": 64}, False, "did you mean 'window'"),
        ({"sparse_sise": 64}, True, "did you mean 'sparse_size'"),
        ({"feature_map_path": "x"}, True, "unknown model_args 'feature_map_path'"),
        ({"budget": "auto"}, True, "did you mean 'budgets'"),
    ],
)
def test_lm_eval_model_args_typos_are_refused(args, registered, fragment):
    from lola.integrations.lm_eval.model import check_model_args

    with pytest.raises(ValueError, match=fragment):
        check_model_args(args, registered=registered)


def test_lm_eval_model_args_for_from_pretrained_pass_for_hub_models():
    from lola.integrations.lm_eval.model import check_model_args

    check_model_args({"attn_implementation": "sdpa", "low_cpu_mem_usage": True, "batch_size": 2}, registered=False)


def test_lm_eval_apply_lola_no_evaluates_the_stock_model():
    from lola.integrations.lm_eval.model import LoLALM

    lm = LoLALM(pretrained="tiny-random-llama", apply_lola="no", batch_size=1)
    assert lm.lola_config is None and getattr(lm.model, "_lola", None) is None
    with pytest.raises(ValueError, match="unknown model_args 'windw'"):
        LoLALM(pretrained="tiny-random-llama", windw=8)


@pytest.mark.parametrize("overrides", [{"0": {"window": 8}, 0: {"window": 16}}, {"1": {"window": 8}, " 1": {"sinks": 2}}])
def test_a_layer_named_twice_in_layer_overrides_is_refused(overrides):
    from pydantic import ValidationError

    import lola

    with pytest.raises(ValidationError, match="layer_overrides names layer"):
        lola.LoLAConfig(layer_overrides=overrides)


# --- feature maps and adapters: what would be cast or overwritten ------------------------------


def _maps(tmp_path):
    from tests.hostile.common import write_random_maps

    write_random_maps(tmp_path / "m")
    return tmp_path / "m"


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.uint8])
def test_feature_map_tensors_that_are_not_floats_are_refused(dtype, tmp_path):
    from lola.pretrained.folder import check_tensors, read_feature_maps

    maps = read_feature_maps(_maps(tmp_path))
    tensors = dict(maps.tensors)
    key = "model.layers.0.self_attn.window_factors"
    tensors[key] = tensors[key].to(dtype)
    with pytest.raises(ValueError, match=rf"'{key}' is torch.{str(dtype).split('.')[-1]}, expected floating point"):
        check_tensors(tensors, maps.geometry, "maps")


def test_two_tensors_for_one_layer_are_refused(tmp_path):
    from lola.pretrained.folder import check_tensors, read_feature_maps

    maps = read_feature_maps(_maps(tmp_path))
    tensors = dict(maps.tensors)
    tensors["layers.0.self_attn.window_factors"] = tensors["model.layers.0.self_attn.window_factors"] + 1  # another prefix
    with pytest.raises(ValueError, match="maps: two tensors for 0 / window_factors"):
        check_tensors(tensors, maps.geometry, "maps")


def _lora(model, layers, dtype=torch.float32):
    from lola.pretrained.geometry import attention_modules

    out = {}
    for i in layers:
        module = attention_modules(model)[i]
        w = module.q_proj.weight
        out[f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight"] = torch.ones(2, w.shape[1], dtype=dtype)
        out[f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight"] = torch.ones(w.shape[0], 2, dtype=dtype)
    return out


def test_lora_tensors_that_are_not_floats_or_doubled_are_refused():
    from lola.models import tiny_random
    from lola.pretrained.lora import LoraSpec, merge_lora

    model, _ = tiny_random()
    spec = LoraSpec(rank=2, alpha=4.0)
    with pytest.raises(ValueError, match="expected floating point"):
        merge_lora(model, _lora(model, [0], torch.int64), spec)
    doubled = _lora(model, [0])
    doubled["model.layers.0.self_attn.q_proj.lora_A.weight"] = torch.zeros(2, model.config.hidden_size)
    with pytest.raises(ValueError, match="the LoRA weights: two tensors for layers.0.self_attn.q_proj / A"):
        merge_lora(model, doubled, spec)


def test_lora_does_not_reach_layers_kept_as_full_attention(tmp_path):
    import lola
    from lola.integrations.transformers import apply_lola, remove_lola
    from lola.models import tiny_random
    from lola.pretrained.folder import read_feature_maps, write_feature_maps
    from lola.pretrained.lora import LoraSpec

    model, _ = tiny_random()
    stock = {n: p.detach().clone() for n, p in model.named_parameters()}
    maps = read_feature_maps(_maps(tmp_path))
    folder = tmp_path / "with-lora"
    write_feature_maps(folder, maps.tensors, maps.config, maps.geometry, lora=_lora(model, [0, 1]), lora_spec=LoraSpec(rank=2, alpha=4.0))
    apply_lola(model, lola.LoLAConfig(full_attention_layers=[1]), feature_maps=folder)
    params = dict(model.named_parameters())
    assert torch.equal(params["model.layers.1.self_attn.q_proj.weight"], stock["model.layers.1.self_attn.q_proj.weight"])  # kept stock
    assert not torch.equal(params["model.layers.0.self_attn.q_proj.weight"], stock["model.layers.0.self_attn.q_proj.weight"])  # adapted
    remove_lola(model)
    assert all(torch.equal(p, stock[n]) for n, p in model.named_parameters())


def test_calibrate_refuses_a_length_beyond_the_models_positions():
    from lola.eval.calibrate import calibrate
    from lola.models import tiny_random

    model, tok = tiny_random()
    too_long = model.config.max_position_embeddings + 1
    with pytest.raises(ValueError, match=rf"length {too_long} exceeds what the model can hold"):
        calibrate(model, tok, length=too_long, prompts=1, progress=False)
    with pytest.raises(ValueError, match="power must be a finite number"):
        calibrate(model, tok, length=64, prompts=1, power=float("inf"), progress=False)
