"""lola.integrations.transformers.merged: a saved folder's ``lora_merged`` is checked against its
tensors, not trusted."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import lola
from lola.integrations.transformers import apply_lola, from_pretrained
from lola.integrations.transformers.export import export_pretrained
from lola.models import tiny_random

CFG = lola.LoLAConfig(window=8, sparse_size=6, sinks=2, chunk=4)


@pytest.fixture(scope="module")
def exported(stage2, tmp_path_factory):
    out = tmp_path_factory.mktemp("exported") / "model"
    model, tok = tiny_random()
    export_pretrained(model, tok, out, CFG, feature_maps=stage2)
    return out


def _copy(folder, to):
    to.mkdir()
    for f in folder.iterdir():
        (to / f.name).write_bytes(f.read_bytes())
    return to


def _edit_entry(folder, edit):
    meta = json.loads((folder / "config.json").read_text())
    edit(meta["lola"])
    (folder / "config.json").write_text(json.dumps(meta))


def test_the_folder_records_the_projections_the_adapters_were_merged_into(stage2, exported):
    entry = json.loads((exported / "config.json").read_text())["lola"]
    merged = apply_lola(tiny_random()[0], CFG, feature_maps=stage2)
    assert entry["lora_merged"] is True
    assert entry["merged_projections"]["names"] == sorted(merged._lola.merged_weights)  # every merged projection, and only those
    assert len(entry["merged_projections"]["digest"]) == 64
    from_pretrained(exported)  # a clean folder loads


def test_stock_projections_put_back_are_refused(exported, tmp_path):
    folder = _copy(exported, tmp_path / "stock")
    stock = dict(tiny_random()[0].named_parameters())
    tensors = load_file(folder / "model.safetensors")
    name = json.loads((folder / "config.json").read_text())["lola"]["merged_projections"]["names"][0]
    assert not torch.equal(tensors[name], stock[name].detach())  # the merge changed it
    tensors[name] = stock[name].detach().clone()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"do not match their recorded digest"):
        from_pretrained(folder)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda e: e.pop("merged_projections"), r"lora_merged: true but does not record which projections"),
        (lambda e: e.update(lora_merged=False), r"lora_merged is false"),
        (
            lambda e: e["merged_projections"]["names"].append("model.layers.0.self_attn.z_proj.weight"),
            r"no weights file holds 'model.layers.0.self_attn.z_proj.weight'",
        ),
        (lambda e: e["merged_projections"].update(digest="0" * 64), r"do not match their recorded digest"),
        (lambda e: e["merged_projections"].update(digest="not hex"), r"digest"),
    ],
)
def test_an_entry_that_misstates_the_merge_is_refused(exported, tmp_path, edit, message):
    folder = _copy(exported, tmp_path / "edited")
    _edit_entry(folder, edit)
    with pytest.raises(ValueError, match=message):
        from_pretrained(folder)


def test_a_model_trained_after_the_merge_saves_what_it_holds(stage2, tmp_path):
    model = apply_lola(tiny_random()[0], CFG, feature_maps=stage2)
    name = sorted(model._lola.merged_weights)[0]
    with torch.no_grad():
        dict(model.named_parameters())[name].add_(0.01)  # a fine-tuning step after apply_lola
    model.save_pretrained(tmp_path / "saved")
    loaded = from_pretrained(tmp_path / "saved")
    assert torch.equal(dict(loaded.named_parameters())[name], dict(model.named_parameters())[name])
    loaded.save_pretrained(tmp_path / "again")  # a loaded model re-saves its recorded projections
    again = json.loads((tmp_path / "again" / "config.json").read_text())["lola"]
    assert again["merged_projections"]["names"] == sorted(model._lola.merged_weights)
    from_pretrained(tmp_path / "again")


def test_a_model_without_adapters_records_none(tmp_path):
    model = apply_lola(tiny_random()[0], CFG)
    model.save_pretrained(tmp_path)
    entry = json.loads((tmp_path / "config.json").read_text())["lola"]
    assert entry["lora_merged"] is False and "merged_projections" not in entry
