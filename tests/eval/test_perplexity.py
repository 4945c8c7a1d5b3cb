"""Held-out perplexity: agrees with transformers' own loss, and LoLA with a window that covers
the whole context is full attention."""

import math

import pytest
import torch

from lola.data.text import encode, load_text, split_text
from lola.eval.perplexity import PerplexityRun, format_perplexity, perplexity_configs, run_perplexity, window_nll
from lola.models import tiny_random


def test_window_nll_matches_the_model_loss():
    model, tok = tiny_random()
    ids = encode(tok, "The quick brown fox jumps over the lazy dog. " * 3)[None, :100]
    nll, n = window_nll(model, ids)
    with torch.no_grad():
        loss = model(ids, labels=ids).loss  # transformers shifts the labels itself
    assert n == 99
    assert nll / n == pytest.approx(float(loss), rel=1e-5)


@pytest.mark.parametrize("logits_chunk", [1, 7, 99, 4096])
def test_window_nll_in_logit_chunks_is_the_model_loss(logits_chunk):
    # Chunks that do not divide the 99 predicted positions, one position each, and one chunk.
    model, tok = tiny_random()
    ids = encode(tok, "The quick brown fox jumps over the lazy dog. " * 3)[None, :100]
    with torch.no_grad():
        loss = model(ids, labels=ids).loss
    nll, n = window_nll(model, ids, logits_chunk=logits_chunk)
    assert n == 99 and nll / n == pytest.approx(float(loss), rel=1e-5)


@pytest.mark.parametrize(
    "model_type, transform", [("gemma2", {"final_logit_softcapping": 0.1}), ("cohere", {"logit_scale": 0.5}), ("granite", {"logits_scaling": 4.0})]
)
def test_window_nll_keeps_a_models_own_logit_transform(model_type, transform):
    # Logits changed after the projection (soft-capped, scaled) are the model's own forward's:
    # the projection alone would give another loss.
    from tests.hostile.common import tiny_model

    model = tiny_model(model_type, **transform)
    ids = torch.randint(0, 101, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        loss = float(model(ids, labels=ids).loss)
        projected = model.get_output_embeddings()(model.get_decoder()(ids).last_hidden_state[0, :-1])
        plain = float(torch.nn.functional.cross_entropy(projected, ids[0, 1:]))
    assert plain != pytest.approx(loss, rel=1e-3)  # the transform matters for this model
    nll, n = window_nll(model, ids, logits_chunk=8)
    assert nll / n == pytest.approx(loss, rel=1e-5)


def test_window_nll_refuses_a_chunk_of_no_positions():
    model, _ = tiny_random()
    with pytest.raises(ValueError, match="logits_chunk must be a positive number of positions, got 0"):
        window_nll(model, torch.zeros(1, 4, dtype=torch.long), logits_chunk=0)


def test_a_window_covering_the_context_is_full_attention():
    model, tok = tiny_random()
    run = PerplexityRun(
        model="tiny-random-llama", lengths=[64, 128], windows=2, window=128, sparse_size=0, methods=["full", "hybrid"], text=["pydoc"], generate=0
    )
    res = run_perplexity(run, model, tok, progress=False)
    for n in (64, 128):
        assert res["hybrid"][n]["ppl"] == pytest.approx(res["full"][n]["ppl"], rel=1e-4)
        assert res["full"][n]["windows"] == 2 and res["full"][n]["tokens"] == 2 * (n - 1)
    # and the held-out windows are the last 10% of the text, in order
    _, heldout = split_text(load_text("pydoc"))
    ids = encode(tok, heldout)
    nll = sum(window_nll(model, ids[w * 64 : (w + 1) * 64][None])[0] for w in range(2))
    assert res["full"][64]["ppl"] == pytest.approx(math.exp(nll / 126), rel=1e-5)


def test_a_small_window_changes_the_result():
    model, tok = tiny_random()
    run = PerplexityRun(model="tiny-random-llama", lengths=[128], windows=1, window=8, sparse_size=0, methods=["full", "hybrid"], text=["pydoc"], generate=0)
    res = run_perplexity(run, model, tok, progress=False)
    assert abs(res["hybrid"][128]["ppl"] / res["full"][128]["ppl"] - 1) > 1e-6  # a random model barely uses attention
    assert "(" in format_perplexity(res)


def test_configs_and_bad_lengths():
    cfgs = perplexity_configs(PerplexityRun(window=32, sparse_size=16))
    assert cfgs["full"] is None and cfgs["hybrid"].sparse_size == 0 and cfgs["lola"].sparse_size == 16
    model, tok = tiny_random()
    with pytest.raises(ValueError, match="exceeds what the model can hold"):
        run_perplexity(PerplexityRun(lengths=[10_000], text=["pydoc"]), model, tok, progress=False)


def test_past_the_context_bounded_methods_are_measured_and_full_attention_refused():
    model, tok = tiny_random()
    model.config.max_position_embeddings = 96
    run = PerplexityRun(
        model="tiny-random-llama",
        lengths=[64, 160],
        windows=1,
        window=8,
        sparse_size=8,
        methods=["full", "lola"],
        text=["pydoc"],
        generate=0,
        positions="bounded",
    )
    res = run_perplexity(run, model, tok, progress=False)
    assert res["full"][160] == {"refused": "past the model's 96 positions"}
    assert res["full"][64]["ppl"] > 1 and res["lola"][160]["ppl"] > 1
    assert "refused" in format_perplexity(res)
    with pytest.raises(ValueError, match="no method bounds its positions"):
        run_perplexity(run.model_copy(update={"positions": None}), model, tok, progress=False)
