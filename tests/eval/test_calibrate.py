import json

import pytest
import torch

from lola.cli import main
from lola.eval.calibrate import calibrate, calibration_prompts, random_sentences, retrieval_scores
from lola.eval.niah import make_sample
from lola.models import tiny_random


@pytest.fixture(scope="module")
def tiny():
    return tiny_random()


def test_prompts_locate_the_needle_and_the_answer(tiny):
    _, tok = tiny
    prompts = calibration_prompts(tok, 600, 3)
    for p in prompts:
        ids = p.input_ids[0].tolist()
        n0, n1 = p.needle
        r0, r1 = p.readers
        value = tok.decode(ids[n0:n1])
        assert value.isdigit() and len(value) == 7
        assert tok.decode(ids[r0 + 1 : r1 + 1]) == " " + value  # readers predict the answer
        assert len(ids) <= 600 + 8
    assert len({tuple(p.needle) for p in prompts}) == 3  # evenly spread depths


def test_calibration_text_is_not_an_evaluation_haystack(tiny):
    _, tok = tiny
    p = calibration_prompts(tok, 600, 1)[0]
    text = tok.decode(p.input_ids[0])
    assert "passcode" in text and "special magic" not in text and "The grass is green" not in text
    assert random_sentences(3, 1) == random_sentences(3, 1) != random_sentences(3, 2)


def test_scores_equal_transformers_own_attention_weights(tiny):
    # Independent check: eager attention with output_attentions gives every head's weights.
    model, tok = tiny
    prompts = calibration_prompts(tok, 400, 2)
    scores = retrieval_scores(model, prompts)
    assert scores.shape == (2, 2) and bool((scores >= 0).all()) and bool((scores <= 1).all())
    model.set_attn_implementation("eager")
    try:
        expect = torch.zeros(2, 2)
        for p in prompts:
            with torch.no_grad():
                att = model(p.input_ids, output_attentions=True).attentions  # per layer [1, H, T, T]
            for layer, a in enumerate(att):
                mass = a[0, :, p.readers[0] : p.readers[1], p.needle[0] : p.needle[1]].sum(-1).mean(-1)  # [H]
                expect[layer] += mass.view(2, 2).mean(-1)
        torch.testing.assert_close(scores, expect / len(prompts), rtol=1e-4, atol=1e-6)
    finally:
        model.set_attn_implementation("sdpa")


def test_calibrated_budgets_never_exceed_the_uniform_bytes(tiny):
    model, tok = tiny
    b = calibrate(model, tok, model_name="tiny", length=300, prompts=2, sparse_size=16, progress=False)
    assert b.total_slots <= 16 * 2 * 2 and (b.num_layers, b.num_kv_heads) == (2, 2)
    assert "lola calibrate" in b.source["command"]


def test_cli_writes_budgets_that_niah_accepts(tmp_path, capsys):
    out = tmp_path / "budgets.json"
    assert main(["calibrate", "--model", "tiny-random-llama", "--length", "300", "--prompts", "2", "--sparse-size", "8", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert sum(map(sum, data["sparse_size_per_head"])) <= 8 * 4
    assert "total" in capsys.readouterr().out
    assert main(["calibrate", "--model", "tiny-random-llama", "--prompts", "0", "--out", str(out)]) == 2
    assert "--prompts: Input should be greater than or equal to 1" in capsys.readouterr().err


def test_answer_prefix_starts_the_answer(tiny):
    _, tok = tiny
    s = make_sample(
        tok, "niah_single_1", 400, 0.5, 1, haystack="A b c. D e f.", needle="K {key} is {value}.", question="What is {key}?", answer_prefix=" {key} is"
    )
    assert s.text.endswith(f" {s.key} is")
    with pytest.raises(ValueError, match="answer_prefix needs a custom question"):
        make_sample(tok, "niah_single_1", 400, 0.5, 1, answer_prefix="x")


def test_cli_calibrates_the_weights_a_linearized_model_attends_with(tmp_path):
    # --feature-maps merges the folder's LoRA adapters before the heads are scored: the scores
    # equal those of the merged model by hand, and differ from the stock model's.
    from lola import models
    from lola.pretrained.lora import merge_lora
    from tests.hostile.common import write_maps_with_lora

    lora, spec = write_maps_with_lora(tmp_path / "lin", "q_proj", seed=5)
    model, tok = models.tiny_random()
    out = tmp_path / "budgets.json"
    argv = ["calibrate", "--model", "tiny-random-llama", "--length", "300", "--prompts", "2", "--sparse-size", "8"]
    assert main([*argv, "--feature-maps", str(tmp_path / "lin"), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["source"]["feature_maps"] == str(tmp_path / "lin") and "--feature-maps" in data["source"]["command"]
    prompts = calibration_prompts(tok, 300, 2)
    stock = retrieval_scores(model, prompts)
    merge_lora(model, lora, spec)
    merged = retrieval_scores(model, prompts)
    torch.testing.assert_close(torch.tensor(data["scores"]), merged, atol=2e-6, rtol=0)
    assert (merged - stock).abs().max() > 1e-3
