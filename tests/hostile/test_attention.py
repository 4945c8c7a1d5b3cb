"""Hostile inputs, class 1 (attention LoLA does not reproduce, accepted): a model whose own
attention LoLA would change, or a LoLA model whose attention was switched away, is refused.

Mechanisms: :func:`lola.integrations.transformers.support.unsupported_reason` (one list of
reasons, checked by ``apply_lola`` unless ``force=True``), now with a sliding window that binds
inside the model's context; and
:func:`~lola.integrations.transformers.applied.check_attention_implementation`, run by a forward
pre-hook ``apply_lola`` installs and by ``LoLACache.check_model``, which refuses a model whose
attention implementation is no longer LoLA's (outside an ``attention_switched`` block).
"""

from __future__ import annotations

import re

import pytest
import torch

import lola

transformers = pytest.importorskip("transformers")


def _tiny(model_type: str, **kw):
    from transformers import AutoConfig, AutoModelForCausalLM

    common = dict(vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **{**common, **kw})).eval()


SLIDING = [
    ("mistral", dict(sliding_window=16, max_position_embeddings=256), "sliding window of 16 tokens (layers all)"),
    ("gemma3_text", dict(sliding_window=16, max_position_embeddings=256), "sliding window of 16 tokens (layers [0, 1])"),
    ("qwen2", dict(sliding_window=16, max_position_embeddings=256, use_sliding_window=True, max_window_layers=0), "sliding window of 16"),
    ("cohere2", dict(sliding_window=16, max_position_embeddings=256), "sliding window of 16"),
    ("ministral", dict(sliding_window=16, max_position_embeddings=256), "sliding window of 16"),
]


@pytest.mark.parametrize("model_type, config, fragment", SLIDING, ids=[s[0] for s in SLIDING])
def test_a_model_with_a_binding_sliding_window_is_refused_unless_forced(model_type, config, fragment):
    from lola.integrations.transformers import apply_lola, remove_lola

    model = _tiny(model_type, **config)
    with pytest.raises(ValueError, match=re.escape(fragment) + ".*force=True"):
        apply_lola(model, lola.LoLAConfig())
    assert getattr(model, "_lola", None) is None
    apply_lola(model, lola.LoLAConfig(), force=True)  # the caller's decision, taken knowingly
    remove_lola(model)


def test_the_refused_window_really_changes_stock_outputs():
    """The reason is real: beyond its window, the stock model's logits differ from those of the
    same weights with the window lifted (what LoLA with nothing evicted computes)."""
    ids = torch.randint(0, 101, (1, 48), generator=torch.Generator().manual_seed(0))
    windowed = _tiny("mistral", sliding_window=16, max_position_embeddings=256, attn_implementation="eager")
    lifted = _tiny("mistral", sliding_window=None, max_position_embeddings=256, attn_implementation="eager")
    lifted.load_state_dict(windowed.state_dict())
    with torch.no_grad():
        a, b = windowed(ids).logits, lifted(ids).logits
    torch.testing.assert_close(a[:, :16], b[:, :16])  # inside the window: the same
    assert not torch.allclose(a[:, 16:], b[:, 16:], atol=1e-4)  # beyond it: not


@pytest.mark.parametrize(
    "model_type, config",
    [
        ("mistral", dict(sliding_window=None, max_position_embeddings=256)),
        ("mistral", dict(sliding_window=4096, max_position_embeddings=4096)),  # never binds
        ("qwen2", dict(sliding_window=16, max_position_embeddings=256, use_sliding_window=False)),
    ],
)
def test_a_window_that_never_binds_is_accepted(model_type, config):
    from lola.integrations.transformers import apply_lola, remove_lola

    model = _tiny(model_type, **config)
    apply_lola(model, lola.LoLAConfig())
    remove_lola(model)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("how", ["generate", "forward with a cache", "generate with a cache"])
def test_switching_the_attention_away_from_lola_is_refused(implementation, how):
    from lola.integrations.transformers import LoLACache, apply_lola, remove_lola
    from lola.models import tiny_random

    model, _ = tiny_random()
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4))
    cache = LoLACache(model)
    model.set_attn_implementation(implementation)
    ids = torch.randint(0, 100, (1, 12))
    run = {
        "generate": lambda: model.generate(ids, max_new_tokens=2, do_sample=False),
        "forward with a cache": lambda: model(ids, cache=cache),
        "generate with a cache": lambda: model.generate(ids, max_new_tokens=2, do_sample=False, cache=cache),
    }[how]
    with torch.no_grad(), pytest.raises(ValueError, match=rf"attention implementation is now '{implementation}'"):
        run()
    model.set_attn_implementation("lola")  # back: LoLA runs again
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, do_sample=False)
    remove_lola(model)
