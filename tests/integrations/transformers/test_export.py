"""lola.integrations.transformers.export: a model with LoLA applied written as a Hugging Face
folder (``lola export``) loads back as the very model lola runs."""

import json

import pytest
import torch

import lola
from lola.cli import main
from lola.integrations.transformers import apply_lola, from_pretrained, remove_lola
from lola.integrations.transformers.export import VLLM_ARCHITECTURE, export_pretrained, is_exported_folder
from lola.io.checksums import weights_digest
from lola.models import tiny_random

CFG = lola.LoLAConfig(window=8, sparse_size=6, sinks=2, chunk=4)


def test_the_exported_folder_is_the_model_lola_runs(stage2, tmp_path):
    model, tok = tiny_random()
    before = weights_digest(model, every_value=True)
    export_pretrained(model, tok, tmp_path / "out", CFG, feature_maps=stage2, vllm=True)
    assert weights_digest(model, every_value=True) == before and getattr(model, "_lola", None) is None  # the caller's model is untouched

    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["architectures"] == [VLLM_ARCHITECTURE]
    assert saved["lola"]["lora_merged"] is True
    assert saved["lola"]["config"]["mixing"] == "lola_authors"  # the rule lola.pretrained.resolve gives LoLA on trained maps, recorded
    assert is_exported_folder(tmp_path / "out")

    reference = apply_lola(tiny_random()[0], CFG, feature_maps=stage2)
    loaded = from_pretrained(tmp_path / "out")
    assert loaded._lola.config == reference._lola.config
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, reference(ids).logits)
    remove_lola(reference)


def test_bfloat16_weights_are_cast_after_the_merge(stage2, tmp_path):
    model, tok = tiny_random()
    export_pretrained(model, tok, tmp_path / "bf16", CFG, feature_maps=stage2, dtype="bfloat16")
    loaded = from_pretrained(tmp_path / "bf16", dtype=torch.float32)
    merged = apply_lola(tiny_random()[0], CFG, feature_maps=stage2)
    want = merged.model.layers[0].self_attn.q_proj.weight.to(torch.bfloat16).float()  # merged in float32, then cast
    assert torch.equal(loaded.model.layers[0].self_attn.q_proj.weight, want)


def test_refusals_name_what_is_wrong(tmp_path):
    model, tok = tiny_random()
    with pytest.raises(ValueError, match="dtype must be one of"):
        export_pretrained(model, tok, tmp_path / "a", CFG, dtype="int8")
    with pytest.raises(ValueError, match="give it the stock model"):
        export_pretrained(apply_lola(tiny_random()[0], CFG), tok, tmp_path / "b", CFG)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="lola export did not write"):
        export_pretrained(model, tok, foreign, CFG)
    assert (foreign / "config.json").read_text() == "{}"  # nothing replaced


def test_the_command_writes_a_folder_and_replaces_only_its_own(tmp_path, capsys):
    out = tmp_path / "exported"
    assert main(["export", "--model", "tiny-random-llama", "--out", str(out)]) == 0
    assert "mixing softmax_only" in capsys.readouterr().out  # training-free: no trained maps, the exact tokens alone
    first = (out / "model.safetensors").read_bytes()
    assert main(["export", "--model", "tiny-random-llama", "--dtype", "bfloat16", "--out", str(out)]) == 0
    assert (out / "model.safetensors").read_bytes() != first and from_pretrained(out)._lola.config.window == 60
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert main(["export", "--model", "tiny-random-llama", "--out", str(tmp_path / "other")]) == 2
    assert "--out" in capsys.readouterr().err and (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_bounded_positions_export_for_transformers_and_for_vllm(tmp_path):
    model, tok = tiny_random()
    bounded = CFG.model_copy(update={"positions": "bounded"})
    export_pretrained(model, tok, tmp_path / "out", bounded)
    loaded = from_pretrained(tmp_path / "out")
    cfg = loaded._lola.config
    assert (cfg.positions, cfg.exact_distance, cfg.state_positions) == ("bounded", 8192 - 4, 8192)  # the limits it was exported with
    assert loaded._lola.modules[0].positions is not None
    export_pretrained(model, tok, tmp_path / "vllm", bounded, vllm=True)
    saved = json.loads((tmp_path / "vllm" / "config.json").read_text())
    # vLLM takes a max_model_len past max_position_embeddings only up to model_max_length
    assert saved["model_max_length"] > saved["max_position_embeddings"] and saved["architectures"] == ["LoLALlamaForCausalLM"]
    assert (saved["lola"]["config"]["exact_distance"], saved["lola"]["config"]["state_positions"]) == (8192 - 4, 8192)
    export_pretrained(model, tok, tmp_path / "vllm-absolute", CFG, vllm=True)
    assert "model_max_length" not in json.loads((tmp_path / "vllm-absolute" / "config.json").read_text())


def test_a_prefill_chunk_is_refused_for_vllm_and_kept_for_transformers(tmp_path):
    """vLLM's pages hold the window of one decode chunk, so its plug-in steps every chunk: an
    export for it with a prefill chunk is refused rather than served without it."""
    model, tok = tiny_random()
    prefill = CFG.model_copy(update={"schedule_kwargs": {"prefill_chunk": 8}})
    with pytest.raises(ValueError, match="prefill_chunk=8: the vLLM plug-in steps every chunk"):
        export_pretrained(model, tok, tmp_path / "vllm", prefill, vllm=True)
    assert not (tmp_path / "vllm" / "config.json").exists()
    export_pretrained(model, tok, tmp_path / "out", prefill)
    assert from_pretrained(tmp_path / "out")._lola.config.schedule_kwargs == {"prefill_chunk": 8}


def test_the_export_command_gives_vllm_the_plain_schedule_and_transformers_the_prefill_chunk(stage2, tmp_path):
    """The default LoLA of `lola niah` on trained maps steps every 256 tokens in a prefill; the
    vLLM plug-in steps every chunk (its pages hold one chunk's window), so `--vllm` exports that."""
    for vllm, expected in ((False, {"prefill_chunk": 256}), (True, {})):
        out = tmp_path / ("vllm" if vllm else "hf")
        assert main(["export", "--model", "tiny-random-llama", "--feature-maps", str(stage2), "--out", str(out), *(["--vllm"] if vllm else [])]) == 0
        assert json.loads((out / "config.json").read_text())["lola"]["config"]["schedule_kwargs"] == expected
