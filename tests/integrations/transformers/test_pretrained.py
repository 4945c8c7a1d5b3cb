"""save_pretrained / lola.from_pretrained round trip."""

import json
import logging

import pytest
import torch

import lola
from lola.integrations.transformers import apply_lola, from_pretrained, remove_lola
from tests.integrations.transformers.conftest import tiny

CFG = lola.LoLAConfig(window=6, sparse_size=5, sinks=2, chunk=4, mixing="lola_authors", layer_overrides={1: {"sparse_size": 3}})


def _perturb_lola_parameters(model):
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lola." in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


def test_round_trip_keeps_config_trained_parameters_and_outputs(tmp_path):
    model = apply_lola(tiny("llama"), CFG)
    _perturb_lola_parameters(model)  # trained-looking maps and window factors, not the defaults
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert lola.LoLAConfig.model_validate(saved["lola"]["config"]) == CFG
    loaded = from_pretrained(tmp_path)
    assert loaded._lola.config == CFG
    want = {n: p for n, p in model.named_parameters() if ".lola." in n}
    got = {n: p for n, p in loaded.named_parameters() if ".lola." in n}
    assert want.keys() == got.keys() and all(torch.equal(want[n], got[n]) for n in want)
    ids = torch.randint(0, 101, (2, 30))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
        assert torch.equal(loaded.generate(ids, max_new_tokens=5, do_sample=False), model.generate(ids, max_new_tokens=5, do_sample=False))


def test_a_stock_folder_and_a_foreign_entry_are_refused(tmp_path):
    stock = tiny("llama")
    remove_lola(apply_lola(stock, CFG))
    stock.save_pretrained(tmp_path / "stock")
    assert "lola" not in json.loads((tmp_path / "stock" / "config.json").read_text())
    with pytest.raises(ValueError, match="no LoLA entry"):
        from_pretrained(tmp_path / "stock")
    with pytest.raises(ValueError, match="no config.json"):
        from_pretrained(tmp_path / "nowhere")
    model = apply_lola(tiny("llama"), CFG)
    model.save_pretrained(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    meta["lola"] = {"format": "someone-else/9"}
    (tmp_path / "m" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="lola did not write"):
        from_pretrained(tmp_path / "m")


def test_missing_lola_tensors_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    model = apply_lola(tiny("llama"), CFG)
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = {k: v for k, v in load_file(weights).items() if ".layers.1.self_attn.lola." not in k}
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="do not match its config: missing"):
        from_pretrained(tmp_path)


def test_a_clean_load_reports_nothing_and_leaves_the_class_as_it_was(tmp_path, caplog):
    from transformers import LlamaForCausalLM

    declared = LlamaForCausalLM.__dict__.get("_keys_to_ignore_on_load_unexpected", "unset")
    model = apply_lola(tiny("llama"), CFG)
    model.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        from_pretrained(tmp_path)
    # transformers' report would list lola's tensors as UNEXPECTED ("not ok if you expect identical arch").
    assert "LOAD REPORT" not in caplog.text and "UNEXPECTED" not in caplog.text
    assert LlamaForCausalLM.__dict__.get("_keys_to_ignore_on_load_unexpected", "unset") == declared
    # A stock load of the same folder still reports them: only lola's loader declares them.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        LlamaForCausalLM.from_pretrained(tmp_path)
    assert "UNEXPECTED" in caplog.text


def _rewrite(path, drop=(), change=None):
    from safetensors.torch import load_file, save_file

    tensors = {k: v for k, v in load_file(path).items() if not any(d in k for d in drop)}
    if change:
        tensors.update(change(tensors))
    save_file(tensors, path, metadata={"format": "pt"})


def test_a_missing_model_weight_is_an_error_not_a_random_one(tmp_path):
    model = apply_lola(tiny("llama"), CFG)
    model.save_pretrained(tmp_path)
    _rewrite(tmp_path / "model.safetensors", drop=("embed_tokens",))
    with pytest.raises(ValueError, match=r"lacks 1 weight\(s\) of the model \(model\.embed_tokens\.weight\)"):
        from_pretrained(tmp_path)


def test_lola_tensors_of_the_wrong_shape_or_kind_are_refused(tmp_path):
    model = apply_lola(tiny("llama"), CFG)
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    name = next(n for n, _ in model.named_parameters() if n.endswith("lola.window_factors"))
    original = weights.read_bytes()
    _rewrite(weights, change=lambda t: {name: t[name].round().to(torch.int32)})
    with pytest.raises(ValueError, match=rf"{name}.*torch.int32, expected a floating-point tensor"):
        from_pretrained(tmp_path)
    weights.write_bytes(original)
    _rewrite(weights, change=lambda t: {name: torch.cat([t[name], t[name]])})
    with pytest.raises(ValueError, match=rf"{name}.*has shape"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "edit, field",
    [(lambda e: e.update(junk=1), "junk"), (lambda e: e.update(lora_merged="yes"), "lora_merged"), (lambda e: e["config"].update(windw=3), "windw")],
)
def test_the_saved_entry_is_read_as_strictly_as_the_api(tmp_path, edit, field):
    model = apply_lola(tiny("llama"), CFG)
    model.save_pretrained(tmp_path)
    meta = json.loads((tmp_path / "config.json").read_text())
    edit(meta["lola"])
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"config.json: its 'lola' entry.*{field}"):
        from_pretrained(tmp_path)
