"""Shipped feature maps: a registered name resolves to a sha256-checked folder, everywhere a
feature-map folder is accepted; a damaged file is refused."""

import hashlib
import json
import shutil

import pytest
import torch

import lola
import lola.pretrained.shipped as shipped
from lola.integrations.transformers import apply_lola, remove_lola
from lola.linearize import read_feature_maps
from lola.models import tiny_random


@pytest.fixture
def registered(folder, tmp_path, monkeypatch):
    root = tmp_path / "shipped"
    files = shipped.pack(folder, root / "tiny-maps")
    assert set(files) == {"feature_maps.safetensors", "lola_config.json", "report.json"}  # no checkpoints
    assert files == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (root / "tiny-maps").iterdir()}
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", root)
    monkeypatch.setitem(shipped.SHIPPED, "tiny-maps", shipped.ShippedMaps(model="tiny-random-llama", files=files, summary="test"))
    return root / "tiny-maps"


def test_a_shipped_name_loads_like_its_folder(registered, folder):
    by_name, by_path = read_feature_maps("tiny-maps"), read_feature_maps(folder)
    assert by_name.path == str(registered)
    for k, t in by_path.tensors.items():  # shipped in bfloat16
        assert by_name.tensors[k].dtype == torch.bfloat16
        torch.testing.assert_close(by_name.tensors[k].float(), t, rtol=1e-2, atol=1e-2)
    model, _ = tiny_random()
    apply_lola(model, lola.LoLAConfig(sparse_size=0), feature_maps="tiny-maps")
    assert model._lola.feature_maps == str(registered)
    remove_lola(model)


def test_packed_in_float32_the_tensors_are_those_measured(folder, tmp_path):
    shipped.pack(folder, tmp_path / "f32", dtype="float32")
    a, b = read_feature_maps(folder), read_feature_maps(tmp_path / "f32")
    assert a.tensors.keys() == b.tensors.keys()
    assert all(b.tensors[k].dtype == torch.float32 and torch.equal(b.tensors[k], a.tensors[k]) for k in a.tensors)
    with pytest.raises(ValueError, match="dtype"):
        shipped.pack(folder, tmp_path / "f16", dtype="float16")


def test_models_load_linearized(registered):
    model, tok = lola.models.load("tiny-random-llama", linearized=True)
    assert model._lola.feature_maps == str(registered) and model._lola.config.mixing == "lola_authors"  # LoLA: the paper's rule
    hybrid, _ = lola.models.load("tiny-random-llama", linearized=True, lola_config=lola.LoLAConfig(sparse_size=0, sinks=0, schedule="tokenwise"))
    assert hybrid._lola.config.mixing == "lolcats" == read_feature_maps("tiny-maps").config.mixing  # the hybrid as trained
    with pytest.raises(ValueError, match="no linearized feature maps ship"):
        lola.models.load("tiny-random-llama-2", linearized=True)
    with pytest.raises(ValueError, match="only used with linearized=True"):
        lola.models.load("tiny-random-llama", lola_config=lola.LoLAConfig())


def test_a_damaged_or_missing_file_is_refused(registered):
    read_feature_maps("tiny-maps")  # verified once: a file damaged later is verified again
    data = bytearray((registered / "feature_maps.safetensors").read_bytes())
    data[-1] ^= 0xFF  # the same size
    (registered / "feature_maps.safetensors").write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="sha256"):
        read_feature_maps("tiny-maps")
    (registered / "feature_maps.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(RuntimeError, match="sha256"):
        read_feature_maps("tiny-maps")
    (registered / "feature_maps.safetensors").unlink()
    with pytest.raises(RuntimeError, match="lack"):
        read_feature_maps("tiny-maps")
    with pytest.raises(KeyError, match="no shipped feature maps"):
        shipped.shipped_folder("nope")


def test_truncated_safetensors_names_the_file(folder, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    data = (bad / "feature_maps.safetensors").read_bytes()
    (bad / "feature_maps.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="feature_maps.safetensors is not the file lola_config.json records"):
        read_feature_maps(bad)
    meta = json.loads((bad / "lola_config.json").read_text())
    del meta["files"]  # a folder written before the sums were recorded
    (bad / "lola_config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="feature_maps.safetensors is not a readable safetensors file"):
        read_feature_maps(bad)


def test_shipped_maps_refuse_a_model_of_another_shape(registered):
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(
        LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
    )
    with pytest.raises(ValueError, match="trained for another model.*num_layers: maps 2 vs model 3"):
        apply_lola(other, lola.LoLAConfig(), feature_maps="tiny-maps")
    assert getattr(other, "_lola", None) is None


def test_commands_accept_a_shipped_name(registered, capsys):
    from lola.cli import main
    from lola.eval.runner import NiahRun

    assert NiahRun(feature_maps="tiny-maps").feature_maps == "tiny-maps"
    with pytest.raises(ValueError, match="not a feature-map folder"):
        NiahRun(feature_maps="not-shipped")
    args = [
        "perplexity",
        "--model",
        "tiny-random-llama",
        "--feature-maps",
        "tiny-maps",
        "--length",
        "64",
        "--windows",
        "1",
        "--text",
        "pydoc",
        "--generate",
        "0",
    ]
    assert main(args) == 0
    assert "feature maps tiny-maps" in capsys.readouterr().out
