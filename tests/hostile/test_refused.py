"""Hostile inputs, class ``refused``, through the API: nothing is cast, guessed or dropped.

- text that is not text (NUL bytes anywhere, not UTF-8, a haystack whose first line cannot fit)
  is refused naming the file (:func:`lola.data.text.read_text_file`, the one reader of user text
  files), and a text listed twice, under one name or two, is refused;
- names, flags and keys: lm-eval model_args are parsed, not cast, and typos are refused with the
  close name; a key given twice in a lola_config or budgets file, a layer named twice in
  ``layer_overrides``, and templates with conversions or format specs are refused;
- degenerate or contradictory configs are refused where they are built: a storage head with no
  exact token under ``softmax_only``, full attention in every layer, ``affine=True`` with a rule
  without an affine form, a share-cap start without a cap, variants without the lola method;
- ``compose``, the layer call, the policy registry, ``apply_lola`` and ``generate()`` refuse what
  they cannot take; feature-map and LoRA tensors must be floats, one per name, and adapters
  never reach a layer kept as stock attention.

The last test keeps the record of the second round of cases (tables here and in the other
class files).
"""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from pydantic import ValidationError

import lola
from lola.cli import main
from lola.eval.runner import NiahRun
from lola.integrations.transformers import apply_lola
from tests.hostile.common import CFG, GOOD_BUDGETS, Case, ids, layer, params, qkv, tiny_lola, write_random_maps
from tests.integrations.transformers.conftest import tiny

transformers = pytest.importorskip("transformers")


# -- text that is not text, or given twice ---------------------------------------------------------


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


@pytest.mark.parametrize("offset", [70_000, 300_000])
def test_nul_bytes_far_into_a_text_are_found(offset, tmp_path):
    from lola.data.text import read_text_file

    path = tmp_path / "t.txt"
    path.write_bytes(b"plain words. " * (offset // 13) + b"\x00\x00tail")
    with pytest.raises(ValueError, match=r"t.txt.*NUL bytes.*byte"):
        read_text_file(path)


def test_a_text_file_listed_twice_is_refused(tmp_path):
    from lola.data.text import load_documents

    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("one document. " * 20)
    for sources in ([str(folder / "a.txt"), str(folder / "a.txt")], [str(folder), str(folder / "a.txt")], [str(folder / "a.txt"), str(folder / "." / "a.txt")]):
        with pytest.raises(ValueError, match="a.txt.*twice"):
            load_documents(sources)


def test_one_file_under_two_names_is_one_text_listed_twice(tmp_path):
    from lola.data.text import load_documents

    (tmp_path / "a.txt").write_text("one document. " * 20)
    os.link(tmp_path / "a.txt", tmp_path / "b.txt")
    with pytest.raises(ValueError, match="twice"):
        load_documents([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")])


def test_a_haystack_whose_first_line_does_not_fit_is_refused_naming_it():
    from lola.eval.niah import make_sample
    from lola.models import tiny_random

    _, tok = tiny_random()
    with pytest.raises(ValueError, match="no room for one line of --haystack-file long.txt"):
        make_sample(
            tok, "niah_single_1", 600, 0.5, seed=1, max_new_tokens=2, haystack="A" + " very" * 2000 + " long line.", haystack_name="--haystack-file long.txt"
        )


# -- names, flags and keys -------------------------------------------------------------------------


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


@pytest.mark.parametrize("text", ['{"window": 8, "window": 16}', "window: 8\nwindow: 16\n"])
def test_lm_eval_lola_config_files_are_read_the_same_way(text, tmp_path):
    from lola.integrations.lm_eval.model import read_lola_config

    path = tmp_path / ("c.yaml" if text.startswith("window:") else "c.json")
    path.write_text(text)
    with pytest.raises(ValueError, match=r"model_args lola_config .*c\.(json|yaml).*twice"):
        read_lola_config(path)
    path.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(ValueError, match="model_args lola_config .* not a text file"):
        read_lola_config(path)


def test_budgets_with_a_key_twice_are_refused(tmp_path):
    from lola import budgets

    path = tmp_path / "b.json"
    path.write_text(json.dumps(GOOD_BUDGETS)[:-1] + ', "power": 2.0}')
    with pytest.raises(ValueError, match="b.json.*'power' appears twice"):
        budgets.load(path)


@pytest.mark.parametrize(
    "needle, question, prefix, name",
    [
        ("Code {key}={value!s}.", "Code of {key}?", None, "needle"),
        ("Code {key}={value:08}.", "Code of {key}?", None, "needle"),
        ("Code {key}={value}.", "Code of {key!a}?", None, "question"),
        ("Code {key}={value}.", "Code of {key}?", " {key:^{key}} is", "answer_prefix"),
    ],
)
def test_a_template_conversion_or_format_spec_is_refused(needle, question, prefix, name):
    from lola.eval.niah import check_templates

    with pytest.raises(ValueError, match=f"{name} template .* conversion or format spec"):
        check_templates(needle, question, prefix)


@pytest.mark.parametrize("overrides", [{"0": {"window": 8}, 0: {"window": 16}}, {"1": {"window": 8}, " 1": {"sinks": 2}}])
def test_a_layer_named_twice_in_layer_overrides_is_refused(overrides):

    import lola

    with pytest.raises(ValidationError, match="layer_overrides names layer"):
        lola.LoLAConfig(layer_overrides=overrides)


# -- degenerate or contradictory configs -----------------------------------------------------------


@pytest.mark.parametrize(
    "fields, heads",
    [
        (dict(window=0, sparse_size=0, sinks=0), "[0, 1]"),
        (dict(window=0, sparse_size=0, sinks=0, schedule="tokenwise", chunk=1), "[0, 1]"),
        (dict(window_per_head=[0, 4], sparse_size_per_head=[0, 2], sinks=0), "[0]"),
    ],
)
def test_a_head_with_no_exact_token_is_refused_under_softmax_only(fields, heads):
    cfg = lola.LoLAConfig(mixing="softmax_only", **fields)
    with pytest.raises(ValueError, match=re.escape(f"storage heads {heads} hold no exact token")):
        lola.compose(cfg, num_heads=2, head_dim=4)
    # a rule that reads the linear state has something to read: pure linear attention is fine
    attn = lola.compose(cfg.model_copy(update={"mixing": "lola_authors"}), num_heads=2, head_dim=4)
    o, _ = attn(torch.randn(1, 6, 2, 4), torch.randn(1, 6, 2, 4), torch.randn(1, 6, 2, 4))
    assert o.abs().amax() > 0
    # one sink is enough
    lola.compose(cfg.model_copy(update={"sinks": 1}), num_heads=2, head_dim=4)


def test_a_model_layer_with_no_exact_token_is_named():
    cfg = lola.LoLAConfig(window=4, sparse_size=0, sinks=0, mixing="softmax_only", layer_overrides={1: {"window": 0}})
    with pytest.raises(ValueError, match="layer 1: storage heads"):
        apply_lola(tiny("llama"), cfg)


def test_full_attention_in_every_layer_is_refused():
    model = tiny("llama")
    layers = model.config.num_hidden_layers
    with pytest.raises(ValueError, match=f"covers every one of the model's {layers} layers"):
        apply_lola(model, lola.LoLAConfig(full_attention_layers=list(range(layers))))
    apply_lola(model, lola.LoLAConfig(full_attention_layers=list(range(layers - 1))))


@pytest.mark.parametrize("mixing", ["lola_authors", "softmax_only"])
def test_affine_with_a_rule_that_has_no_affine_form_is_refused(mixing):
    with pytest.raises(ValueError, match=f"affine=True weighs the linear term of the lolcats rule only, and mixing='{mixing}' ignores it"):
        lola.compose(lola.LoLAConfig(mixing=mixing, affine=True), num_heads=2, head_dim=4)
    lola.compose(lola.LoLAConfig(mixing="lolcats", affine=True), num_heads=2, head_dim=4)


def test_a_share_cap_start_without_a_cap_is_refused():
    with pytest.raises(ValueError, match="linear_share_cap_from=2048 says where the share cap starts, but linear_share_cap is None"):
        lola.LoLAConfig(mixing="lola_authors", linear_share_cap_from=2048)
    built = lola.compose(lola.LoLAConfig(mixing="lola_authors"), num_heads=2, head_dim=4)
    parts = dict(memory_factory=built.memory_factory, feature_map_q=built.feature_map_q, feature_map_k=built.feature_map_k)
    with pytest.raises(ValueError, match="share_cap_from=5 without a share_cap"):
        lola.LoLAAttention(2, 4, share_cap_from=5, **parts)
    lola.LoLAAttention(2, 4, share_cap=0.1, share_cap_from=5, **parts)  # with a cap: accepted


@pytest.mark.parametrize("methods", [["window"], ["full", "hybrid"], ["hybrid", "window"]])
@pytest.mark.parametrize("variants", [{"a": {"policy": "recency"}}, {"big": {"sparse_size": 64}, "small": {"sparse_size": 8}}])
def test_variants_need_the_lola_method(methods, variants):
    # Variants are LoLA configs: without lola they would be dropped unread.
    with pytest.raises(ValueError, match="variants .* run with the lola method only"):
        NiahRun(methods=methods, variants=variants)
    assert NiahRun(methods=[*methods, "lola"], variants=variants).variants == variants


# -- compose, the layer call, the policy registry and apply_lola -----------------------------------


def test_compose_refuses_a_dict_config():
    with pytest.raises(TypeError, match="cfg must be a LoLAConfig"):
        lola.compose({"window": 4}, num_heads=2, head_dim=8)


CALL_CFG = lola.LoLAConfig(window=4, sparse_size=4, sinks=0, chunk=4)


def _qkv(b=1, t=5, h=2, d=8):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(b, t, h, d, generator=g) for _ in range(3))


BAD_CALLS = [
    ("q has 3 dims", lambda q, k, v: (q[0], k, v, {}), ValueError, "q must be"),
    ("k has other heads", lambda q, k, v: (q, k[:, :, :1], v, {}), ValueError, "k must be"),
    ("int tensors", lambda q, k, v: (q.long(), k.long(), v.long(), {}), TypeError, "floating-point"),
    ("mixed dtypes", lambda q, k, v: (q, k.double(), v, {}), TypeError, "share a dtype"),
    ("NaN in v", lambda q, k, v: (q, k, v.index_fill(1, torch.tensor([2]), float("nan")), {}), ValueError, "v contains non-finite"),
    ("mask shape", lambda q, k, v: (q, k, v, {"padding_mask": torch.ones(1, 4, dtype=torch.bool)}), ValueError, "padding_mask"),
    ("mask of 2s", lambda q, k, v: (q, k, v, {"padding_mask": torch.full((1, 5), 2)}), ValueError, "padding_mask"),
    ("state of a wrong type", lambda q, k, v: (q, k, v, {"state": {"seen": 0}}), TypeError, "state must be"),
]


@pytest.mark.parametrize("name, build, error, match", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_layer_call_refuses_bad_tensors(name, build, error, match):
    attn = lola.compose(CALL_CFG, num_heads=2, head_dim=8)
    q, k, v, kwargs = build(*_qkv())
    with pytest.raises(error, match=match):
        attn(q, k, v, **kwargs)


class _Scorer:
    needs_attention = False

    def score(self, candidates, ctx):  # pragma: no cover - never called
        return candidates.pos.float()


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: lola.policies.get("nope"), KeyError, "unknown policy 'nope'; available: .*sre"),
        (lambda: lola.policies.get(5), TypeError, "policy name must be a string"),
        (lambda: lola.policies.build("sre", nope=1), TypeError, "nope"),
        (lambda: lola.policies.register("", _Scorer), ValueError, "non-empty string"),
        (lambda: lola.policies.register("broken_policy", object), TypeError, "score"),
        (lambda: lola.policies.register("sre", _Scorer), ValueError, "already registered"),
    ],
    ids=["unknown", "not a string", "bad kwargs", "empty name", "no score", "duplicate"],
)
def test_policy_registry_refuses_bad_names(call, error, match):
    with pytest.raises(error, match=match):
        call()
    assert "broken_policy" not in lola.policies.available()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"config": {"window": 4}}, TypeError, "config must be a lola.LoLAConfig"),
        ({"config": lola.LoLAConfig(full_attention_layers=[7])}, ValueError, r"full_attention_layers \[7\] out of range"),
        ({"config": lola.LoLAConfig(layer_overrides={9: {"window": 8}})}, ValueError, r"layer_overrides for layers \[9\]"),
        ({"feature_maps": "/nonexistent/maps"}, FileNotFoundError, "does not exist"),
    ],
    ids=["dict config", "full attention layer", "override layer", "missing folder"],
)
def test_apply_lola_refuses_bad_arguments(llama, kwargs, error, match):
    from lola.integrations.transformers import apply_lola

    with pytest.raises(error, match=match):
        apply_lola(llama, **kwargs)
    assert getattr(llama, "_lola", None) is None


def test_apply_lola_twice_is_refused(llama):
    from lola.integrations.transformers import apply_lola, remove_lola

    apply_lola(llama, lola.LoLAConfig())
    try:
        with pytest.raises(ValueError, match="already applied"):
            apply_lola(llama, lola.LoLAConfig())
    finally:
        remove_lola(llama)


@pytest.mark.parametrize("force", ["no", 0, None], ids=["string", "int", "none"])
def test_a_flag_that_is_not_a_bool_is_refused_naming_it(force):
    from lola.integrations.transformers import apply_lola, patch
    from lola.models import tiny_random

    model, _ = tiny_random()
    with pytest.raises(TypeError, match=rf"force must be True or False, got {type(force).__name__}"):
        apply_lola(model, CFG, force=force)
    with pytest.raises(TypeError, match="force must be True or False"):
        with patch(model, CFG, force=force):
            pass
    assert getattr(model, "_lola", None) is None


# -- feature maps and adapters: what would be cast or overwritten ----------------------------------


def _maps(tmp_path):

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


# -- API inputs: configs, the layer call, generate() -----------------------------------------------


def _config(**fields):
    return lambda tmp_path: lola.LoLAConfig(**fields)


def _compose(cfg=None, **geometry):
    return lambda tmp_path: lola.compose(cfg if cfg is not None else lola.LoLAConfig(), **{"num_heads": 4, "head_dim": 8, **geometry})


CONFIGS = [
    Case("schedule unknown", _config(schedule="weekly"), ValueError, "schedule"),
    Case("schedule_kwargs it does not take", _config(schedule_kwargs={"every": 3}), ValueError, "schedule_kwargs|every"),
    Case("schedule_kwargs not a mapping", _config(schedule_kwargs=["x"]), ValueError, "schedule_kwargs"),
    Case("policy empty", _config(policy=""), ValueError, "policy"),
    Case("policy_kwargs not a mapping", _config(policy_kwargs=[1]), ValueError, "policy_kwargs"),
    Case("mixing in other case", _config(mixing="LoLCATs"), ValueError, "mixing"),
    Case("feature_map unknown", _config(feature_map="cosine"), ValueError, "feature_map"),
    Case("gqa_storage unknown", _config(gqa_storage="kv"), ValueError, "gqa_storage"),
    Case("linear_decay 0", _config(linear_decay=0.0), ValueError, "linear_decay"),
    Case("linear_decay above 1", _config(linear_decay=1.5), ValueError, "linear_decay"),
    Case("linear_share_cap 0", _config(linear_share_cap=0.0), ValueError, "linear_share_cap"),
    Case("linear_share_cap above 1", _config(linear_share_cap=2.0), ValueError, "linear_share_cap"),
    Case("chunk 0", _config(chunk=0), ValueError, "chunk"),
    Case("feature_dim 0", _config(feature_dim=0), ValueError, "feature_dim"),
    Case("scale 0", _config(scale=0.0), ValueError, "scale"),
    Case("window_per_head empty", _config(window_per_head=[]), ValueError, "window_per_head"),
    Case("sparse_size_per_head negative", _config(sparse_size_per_head=[-1]), ValueError, "sparse_size_per_head"),
    Case("full_attention_layers negative", _config(full_attention_layers=[-1]), ValueError, "full_attention_layers|layer indices"),
    Case("full_attention_layers a string", _config(full_attention_layers="0"), ValueError, "full_attention_layers"),
    Case("layer_overrides naming layer 'a'", _config(layer_overrides={"a": {"window": 3}}), ValueError, "layer_overrides"),
    Case("layer_overrides nesting layer_overrides", _config(layer_overrides={0: {"layer_overrides": {}}}), ValueError, "layer_overrides"),
    Case("window_per_head longer than the storage heads", _compose(lola.LoLAConfig(window_per_head=[4, 4, 4]), num_kv_heads=2), ValueError, "window_per_head"),
    Case(
        "sparse_size_per_head shorter than the storage heads",
        _compose(lola.LoLAConfig(sparse_size_per_head=[4]), num_kv_heads=2),
        ValueError,
        "sparse_size_per_head",
    ),
    Case("compose given the config class", lambda t: lola.compose(lola.LoLAConfig, num_heads=4, head_dim=8), TypeError, "cfg must be a LoLAConfig"),
    Case("compose layer as a string", _compose(layer="0"), TypeError, "layer"),
    Case("compose more K/V heads than heads", _compose(num_kv_heads=8), ValueError, "num_kv_heads"),
    Case(
        "compose head_dim beyond bounds",
        _compose(head_dim=10**7),
        ValueError,
        "head_dim must be <=",
    ),
]


def _call(**kwargs):
    def run(tmp_path):
        q, k, v = kwargs.pop("qkv", None) or qkv(2, 10)
        layer()(q, k, v, **kwargs)

    return run


LAYER_CALLS = [
    Case("an empty sequence", _call(qkv=qkv(2, 0)), ValueError, "q|sequence|tokens"),
    Case("q and k of other batch sizes", _call(qkv=(qkv(2, 10)[0], *qkv(1, 10)[1:])), ValueError, "k must be|batch"),
    Case("q and k of other lengths", _call(qkv=(qkv(2, 10)[0], *qkv(2, 9)[1:])), ValueError, "k must be|tokens"),
    Case("q of five dimensions", _call(qkv=(qkv(2, 10)[0][None], *qkv(2, 10)[1:])), ValueError, "q must be"),
    Case("padding_mask as floats", _call(padding_mask=torch.ones(2, 10) * 0.5), (TypeError, ValueError), "padding_mask"),
    Case("q on the meta device", _call(qkv=(qkv(2, 10)[0].to("meta"), *qkv(2, 10)[1:])), ValueError, "device"),
]


def _generate(**kwargs):
    def run(tmp_path):
        from lola.integrations.transformers import LoLACache

        model = tiny_lola()
        inputs = kwargs.pop("input_ids", ids(12, batch=2))
        if kwargs.pop("cache_of_batch", None) is not None:
            cache = LoLACache(model)
            with torch.no_grad():
                model(ids(12, batch=1), cache=cache)
            kwargs["past_key_values"] = cache
        with torch.no_grad():
            model.generate(inputs, max_new_tokens=2, do_sample=False, **kwargs)

    return run


def _forward(input_ids):
    def run(tmp_path):
        model = tiny_lola()
        with torch.no_grad():
            model(input_ids)

    return run


GENERATE = [
    Case("attention_mask of another length", _generate(attention_mask=torch.ones(2, 11, dtype=torch.long)), ValueError, "attention_mask"),
    Case("attention_mask of 2s", _generate(attention_mask=torch.full((2, 12), 2)), ValueError, "attention_mask must hold only 0"),
    Case("attention_mask of halves", _generate(attention_mask=torch.full((2, 12), 0.5)), ValueError, "attention_mask must hold only 0"),
    Case("input_ids of three axes", _generate(input_ids=ids(12, batch=2)[None]), ValueError, r"input_ids must be \[batch, tokens\]"),
    Case("a forward of no tokens", _forward(torch.zeros(2, 0, dtype=torch.long)), ValueError, "input_ids hold no tokens"),
    Case("input_ids beyond the vocabulary", _generate(input_ids=ids(12, batch=2) + 10_000), ValueError, "input_ids"),
    Case("input_ids as floats", _generate(input_ids=ids(12, batch=2).float()), TypeError, "input_ids"),
    Case("a cache of one row for two", _generate(cache_of_batch=1), ValueError, "batch|rows|cache"),
    Case("cache_implementation static", _generate(cache_implementation="static"), ValueError, "cache_implementation"),
]


@pytest.mark.parametrize("case", params(CONFIGS + LAYER_CALLS + GENERATE))
def test_an_api_input_is_refused_naming_it(case, tmp_path):
    with pytest.raises(case.error, match=case.match):
        case.run(tmp_path)


# -- the record of the second round of cases -------------------------------------------------------

SILENT, UNCLEAR, LATE, OOM, LOST = "silent", "unclear", "clear but late", "out of memory", "lost"


# What each case of the second round met before its fixes (every case not named here was refused clearly).
FOUND_BEFORE_FIXES = {
    # fit-scorer resumes
    "text file rewritten under the same path": SILENT,
    "text folder given one more document": SILENT,
    "model of the same name with other weights": SILENT,
    "done beyond --documents": SILENT,
    "done negative": SILENT,
    "statistics with a foreign tensor": SILENT,
    "counts negative": SILENT,
    "--documents raised": UNCLEAR,  # the whole saved spec dumped, the option that differs not named
    "--target switched": UNCLEAR,
    "--min-distance changed": UNCLEAR,
    "--length changed": UNCLEAR,
    "--ridge changed": UNCLEAR,
    "a text source added": UNCLEAR,
    "checkpoint cut in half": UNCLEAR,  # "was not written by lola fit-scorer": it was, and is damaged
    "checkpoint empty": UNCLEAR,
    "checkpoint with a garbled spec": UNCLEAR,
    "done not a number": UNCLEAR,
    "statistics of another geometry": UNCLEAR,  # a shape error from torch
    "statistics holding NaN": UNCLEAR,  # "weight must hold finite ..." naming no file
    "statistics missing a tensor": UNCLEAR,  # a bare KeyError 'n'
    "statistics as integers": UNCLEAR,  # a dtype error from torch
    # command lines
    "niah --out empty": SILENT,  # results/niah-TASK used instead
    "niah --config empty": SILENT,  # the run went on without a config
    "probe --out empty": SILENT,
    "sweep --out empty": SILENT,
    "perplexity --out empty": SILENT,  # the results were not written
    "export --out empty": SILENT,  # the model was written into the current folder
    "linearize --out empty": SILENT,  # trained into the current folder
    "linearize --stage 2 --feature-maps empty": SILENT,  # --out's maps substituted (named instead)
    "fit-scorer resume on a rewritten text": SILENT,  # a scorer fitted on two texts
    "niah --budgets empty": UNCLEAR,  # ". is a folder": neither --budgets nor '' named
    "niah --model empty": UNCLEAR,
    "probe --out a file": UNCLEAR,  # "[Errno 17] File exists", after loading
    "sweep --out a file": UNCLEAR,
    "perplexity --text empty": UNCLEAR,
    "calibrate --out empty": UNCLEAR,
    "fit-scorer --out empty": UNCLEAR,
    "fit-scorer --text empty": UNCLEAR,
    "fit-scorer --text too short": UNCLEAR,  # "the training text" with no option named
    "fit-scorer --feature-maps empty": UNCLEAR,
    "fit-scorer resume with --documents raised": UNCLEAR,
    "fit-scorer resume on a cut checkpoint": UNCLEAR,
    "export --config empty": UNCLEAR,
    "export --feature-maps empty": UNCLEAR,
    "linearize --text empty": UNCLEAR,
    "niah --out holding a garbled journal": LATE,  # refused when the results were written, after the run
    "perplexity --out beside a garbled journal": LATE,
    "calibrate --out beside a garbled journal": LATE,
    "fit-scorer --out beside a garbled journal": LATE,
    "linearize --out holding a garbled journal": LATE,
    "sweep --batch-size 0": LATE,  # after loading the model
    "perplexity --text a folder without text": LATE,
    "perplexity --text of no bytes": LATE,
    "fit-scorer --text of no bytes": LATE,
    "fit-scorer --text a folder without text": LATE,
    "fit-scorer --text binary": LATE,
    "fit-scorer --min-future leaving no keys": LATE,
    "fit-scorer --length beyond the positions": LATE,
    "fit-scorer OUT.partial a folder": LATE,
    "fit-scorer OUT.partial another tool's": LATE,
    "linearize --text missing": LATE,
    # the Python API
    "compose head_dim beyond bounds": OOM,
    "tensors of one layer removed": SILENT,  # the layer decoded as if it had seen nothing
    "tensors of a layer the model lacks": SILENT,
    "lengths for a cache of no tokens": SILENT,
    "register with overwrite='yes'": SILENT,
    "attention_mask of 2s": SILENT,
    "attention_mask of halves": SILENT,
    "bind_pages with a fractional row": SILENT,
    "scores as complex numbers": SILENT,
    "a policy given by name": SILENT,  # accepted; fails inside the first select step
    "a policy without score": SILENT,
    "a layer index as a string": SILENT,
    "apply_lola to a model name": UNCLEAR,  # AttributeError
    "apply_lola feature_maps empty": UNCLEAR,  # "folder '.'"
    "apply_lola feature_maps a file": UNCLEAR,  # "does not exist"
    "apply_lola feature_maps a number": UNCLEAR,  # pathlib's TypeError
    "from_pretrained of a number": UNCLEAR,
    "the weights file cut short": UNCLEAR,  # a SafetensorError naming no file
    "budgets name empty": UNCLEAR,
    "scorer name empty": UNCLEAR,
    "maps path empty": UNCLEAR,
    "maps path a number": UNCLEAR,
    "maps path a file": UNCLEAR,
    "input_ids of three axes": UNCLEAR,  # a shape error from torch
    "a forward of no tokens": UNCLEAR,
    "load_state_dict(None)": UNCLEAR,
    "load_state_dict of a list": UNCLEAR,
    "select_rows beyond the batch": UNCLEAR,  # a bare IndexError from torch
    "select_rows with float indices": UNCLEAR,
    "select_rows with a 2-D index": UNCLEAR,
    "select_rows with a negative index": UNCLEAR,
    "select_rows with a list": UNCLEAR,
    "select_rows with a bool mask": UNCLEAR,
    "write_rows beyond the batch": UNCLEAR,
    "write_rows with float indices": UNCLEAR,
    "write_rows from a dict": UNCLEAR,
    "write_rows from an unallocated state": UNCLEAR,
    "a schedule given by name": UNCLEAR,
}


def test_the_round_has_the_cases_its_docstring_counts():
    """The second round of hostile inputs is the case tables ``FIT_RESUMES`` (test_resume.py),
    ``COMMANDS`` (test_refused_commands.py) and the tables of API inputs (here, in test_state.py,
    test_state_plugins.py and test_files_read.py). The round has 247 cases. Before the round's fixes
    they met: 164 clear (of them 16 clear but late: refused only after the model was loaded, or
    after the whole run when its results were written), 27 silent, 0 lost, 1 out of memory and
    55 unclear (:data:`FOUND_BEFORE_FIXES` names each). Remaining: 0 xfail.

    These totals are the tables' own: a case added, removed or reclassified must be counted.
    """
    from collections import Counter

    from tests.hostile import test_files_read, test_refused_commands, test_resume, test_state, test_state_plugins

    api = CONFIGS + LAYER_CALLS + GENERATE + test_state.MEMORY + test_state.CACHES + test_state_plugins.POLICIES + test_state_plugins.CUSTOM_MEMORY
    cases = test_resume.FIT_RESUMES + test_refused_commands.COMMANDS + api + test_files_read.INTEGRATION + test_files_read.FILES
    names = [c.id for c in cases]
    assert len(set(names)) == len(names), "two cases share an id"
    assert set(FOUND_BEFORE_FIXES) <= set(names), set(FOUND_BEFORE_FIXES) - set(names)
    found = Counter(FOUND_BEFORE_FIXES.get(name, "clear") for name in names)
    record = " ".join(test_the_round_has_the_cases_its_docstring_counts.__doc__.split())
    stated = {k: int(v) for v, k in re.findall(r"(\d+) (cases|clear but late|clear|silent|lost|out of memory|unclear|xfail)\b", record)}
    expected = {"cases": len(cases), "clear": found["clear"] + found[LATE], "clear but late": found[LATE], "silent": found[SILENT]}
    expected |= {"lost": found[LOST], "out of memory": found[OOM], "unclear": found[UNCLEAR], "xfail": sum(c.gap is not None for c in cases)}
    assert stated == expected, (stated, expected)


# -- budgets: their floor and their model, wherever they are applied ----------------------------------


def test_budgets_keep_their_floor_at_another_sparse_size():
    # Calibrated with a floor, then applied at another --sparse-size: re-allocated from the same
    # scores, every head must still keep the floor (it was lost), or the size is refused.
    from lola.budgets import HeadBudgets, allocate

    scores = torch.tensor([[9.0, 0.0, 0.0], [0.0, 0.0, 5.0]], dtype=torch.float64)
    b = HeadBudgets(sparse_size_per_head=allocate(scores, 12, floor=3).tolist(), uniform_sparse_size=12, scores=scores.tolist(), power=0.5, floor=3)
    for size in (4, 8, 20):
        sizes = b.sizes_for(size)
        assert min(min(row) for row in sizes) >= 3 and sum(map(sum, sizes)) <= size * 6
    with pytest.raises(ValueError, match=r"keep at least 3 sparse slots in every head \(their floor\), more than sparse_size 2"):
        b.sizes_for(2)
    saved = json.loads(b.model_dump_json())
    del saved["floor"]  # a file written before the field: its source records the floor
    saved["source"] = {"floor": 3}
    assert HeadBudgets.model_validate(saved).floor == 3


def test_budgets_applied_through_the_api_for_another_model_are_refused():
    from lola.models import tiny_random

    model, _ = tiny_random()
    shipped = lola.budgets.load("smollm2-135m-instruct")  # 30 layers x 3 K/V heads
    with pytest.raises(ValueError, match=r"budgets for 30 layers x 3 K/V heads \(calibrated on smollm2-135m-instruct\), but the model has"):
        shipped.apply(lola.LoLAConfig(), model=model)
    cfg = shipped.apply(lola.LoLAConfig())  # without the model: apply_lola refuses layers it does not have
    with pytest.raises(ValueError, match=r"layer_overrides for layers \[.*\] out of range"):
        lola.apply_lola(model, cfg)


# -- LoLAConfig fields set to no effect: refused, only when the caller set them ----------------------

SET_TO_NO_EFFECT = [
    (dict(feature_map="hedgehog_identity", feature_dim=32), "feature_dim does nothing with hedgehog_identity"),
    (dict(mixing="softmax_only", linear_share_cap=0.5), "the cap does nothing when the state has no share"),
    (dict(window_factor_init=0.0), "the window factor is never read"),
]


@pytest.mark.parametrize("fields, fragment", SET_TO_NO_EFFECT, ids=[",".join(f) for f, _ in SET_TO_NO_EFFECT])
def test_a_config_field_set_to_no_effect_is_refused(fields, fragment):
    with pytest.raises(ValidationError, match=re.escape(fragment)):
        lola.LoLAConfig(**fields)


def test_fields_left_unset_or_at_their_defaults_are_accepted():
    lola.LoLAConfig(schedule="tokenwise")  # chunk left at its default
    # a config drawn over a grid carries fields for the points that use them (the commands
    # refuse them where a user gave them): a chunk under tokenwise, a policy with no sparse cache
    lola.LoLAConfig(schedule="tokenwise", chunk=16)
    lola.LoLAConfig(sparse_size=0, policy="random", policy_kwargs={"seed": 3})


def test_a_share_cap_under_the_rule_without_maps_is_refused_when_applied():
    from tests.hostile.common import tiny_model

    with pytest.raises(ValueError, match=r"linear_share_cap=0.5 caps .* under mixing='softmax_only' .* reads no state"):
        lola.apply_lola(tiny_model("llama"), lola.LoLAConfig(linear_share_cap=0.5))
    lola.LoLAConfig(sparse_size=0)  # the policy left unset
    lola.LoLAConfig(linear_share_cap=0.5)  # the rule left unset: trained maps decide it when loaded
    lola.LoLAConfig(mixing="lola_authors", linear_share_cap=0.5, window_factor_init=0.0)
    cfg = lola.LoLAConfig(policy="recency", layer_overrides={0: {"sparse_size": 0}})
    assert cfg.for_layer(0).sparse_size == 0  # one layer's config keeps the model's fields quietly
