"""Hostile inputs, class ``attention``: a model whose own attention LoLA would change, or a LoLA
model whose attention was switched away, is refused; one whose attention LoLA reproduces is
accepted and gives its stock logits.

Mechanisms: :func:`lola.integrations.transformers.support.unsupported_reason` (one list of
reasons, checked by ``apply_lola`` unless ``force=True``: soft-capped logits, no rotary
embeddings, learned sinks, ALiBi, unverified architectures, and a sliding window that binds
inside the model's context on a layer LoLA runs); and
:func:`~lola.integrations.transformers.model_record.check_attention_implementation`, run by a forward
pre-hook ``apply_lola`` installs (``remove_lola`` takes it away) and by ``LoLACache.check_model``,
which refuses a model whose attention implementation is no longer LoLA's (lola's own
implementations and switches excepted).
"""

from __future__ import annotations

import re

import pytest
import torch

import lola
from tests.hostile.common import DROP, ids, tiny_lola, tiny_model

transformers = pytest.importorskip("transformers")

# -- sliding windows -----------------------------------------------------------------------------


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

    model = tiny_model(model_type, **config)
    with pytest.raises(ValueError, match=re.escape(fragment) + ".*force=True"):
        apply_lola(model, lola.LoLAConfig())
    assert getattr(model, "_lola", None) is None
    apply_lola(model, lola.LoLAConfig(), force=True)  # the caller's decision, taken knowingly
    remove_lola(model)


def test_the_refused_window_really_changes_stock_outputs():
    """The reason is real: beyond its window, the stock model's logits differ from those of the
    same weights with the window lifted (what LoLA with nothing evicted computes)."""
    ids = torch.randint(0, 101, (1, 48), generator=torch.Generator().manual_seed(0))
    windowed = tiny_model("mistral", sliding_window=16, max_position_embeddings=256)
    lifted = tiny_model("mistral", sliding_window=None, max_position_embeddings=256)
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

    model = tiny_model(model_type, **config)
    apply_lola(model, lola.LoLAConfig())
    remove_lola(model)


@pytest.mark.parametrize(
    "layer_types, stock, refused",
    [
        (["sliding_attention", "full_attention", "sliding_attention"], [0, 2], None),
        (["sliding_attention", "full_attention", "sliding_attention"], [0], "layers [2]"),
        (None, [0, 1, 2], None),
        (None, [1], "layers [0, 2]"),
    ],
    ids=["every-sliding-layer-stock", "one-sliding-layer-run", "all-slide-all-stock", "all-slide-two-run"],
)
def test_a_binding_sliding_window_is_refused_only_on_layers_lola_runs(layer_types, stock, refused):
    from types import SimpleNamespace

    from lola.integrations.transformers.support import _sliding_window_reason

    config = SimpleNamespace(sliding_window=16, max_position_embeddings=4096, num_hidden_layers=3, layer_types=layer_types)
    reason = _sliding_window_reason(config, stock)
    assert reason is None if refused is None else refused in reason


# -- attention switched away from LoLA -----------------------------------------------------------


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


class TestTheAttentionImplementationIsCheckedOnEveryForward:
    """A pre-hook installed by ``apply_lola`` (removed by ``remove_lola``) refuses a LoLA model
    switched to another attention implementation, whatever the call (lola's own implementations
    and switches excepted)."""

    CALLS = ["forward-without-cache", "forward-with-a-lola-cache", "generate"]

    @pytest.mark.parametrize("call", CALLS)
    def test_a_switched_implementation_is_refused_saying_what_to_do(self, call):
        from lola.integrations.transformers import LoLACache

        model = tiny_lola()
        model.set_attn_implementation("eager")
        with torch.no_grad(), pytest.raises(ValueError, match=r"attention implementation is now 'eager'.*set_attn_implementation\('lola'\)"):
            if call == "forward-without-cache":
                model(ids(12), use_cache=False)
            elif call == "forward-with-a-lola-cache":
                model(ids(12), cache=LoLACache(model))
            else:
                model.generate(ids(12), max_new_tokens=2, do_sample=False)

    def test_switching_back_runs_lola_again_and_remove_lola_takes_the_check_away(self):
        from lola.integrations.transformers import remove_lola

        model = tiny_lola()
        model.set_attn_implementation("eager")
        model.set_attn_implementation("lola")
        with torch.no_grad():
            model(ids(12), use_cache=False)
        remove_lola(model)
        assert not model._forward_pre_hooks
        model.set_attn_implementation("eager")
        with torch.no_grad():
            model(ids(12), use_cache=False)  # the stock model, as it came

    def test_lola_s_own_implementations_and_switches_run(self):
        """The training hybrid computes the same layers; stage 2's teacher passes switch to the
        stock attention on purpose (from lola's code): both run, the same switch by a caller
        does not."""
        from lola.linearize.finetuning import _teacher
        from lola.linearize.training_attention import HYBRID_ATTENTION, register_hybrid_attention

        model = tiny_lola(lola.LoLAConfig(window=6, sparse_size=0, sinks=0, schedule="tokenwise", mixing="lolcats"))
        register_hybrid_attention()
        model.set_attn_implementation(HYBRID_ATTENTION)
        with torch.no_grad():
            model(ids(12), use_cache=False)
            with _teacher(model, "sdpa"):
                model(ids(12), use_cache=False)
            model.set_attn_implementation("sdpa")
            with pytest.raises(ValueError, match="attention implementation is now 'sdpa'"):
                model(ids(12), use_cache=False)

    def test_a_lola_cache_layer_without_its_lola_module_is_refused(self):
        from lola.integrations.transformers import LoLACache

        model = tiny_lola()
        del model.model.layers[1].self_attn.lola
        with torch.no_grad(), pytest.raises(ValueError, match="layer 1 has a LoLA cache layer but no LoLA module"):
            model(ids(12), cache=LoLACache(model))


# -- architectures -------------------------------------------------------------------------------

# the size keys of SMALL that these configs do not take, and those they take instead
OTHER_KEYS = {
    "opt": dict(intermediate_size=DROP, num_key_value_heads=DROP, head_dim=DROP, ffn_dim=64, word_embed_proj_dim=32),
    "falcon": dict(intermediate_size=DROP, num_key_value_heads=DROP, head_dim=DROP, max_position_embeddings=DROP),
}


@pytest.mark.parametrize(
    "model_type, overrides, match",
    [
        ("gemma2", {}, r"Gemma2ForCausalLM \(model_type 'gemma2'\) soft-caps its attention logits \(attn_logit_softcapping=50.0\)"),
        ("opt", {}, r"model_type 'opt'\) has no rotary position embeddings"),
        ("gpt_oss", {}, "learned attention sinks"),
        ("falcon", {"alibi": True}, "ALiBi"),
        ("phi3", {"pad_token_id": 0}, r"model_type 'phi3'\) is not an architecture whose attention LoLA is verified"),
    ],
)
def test_unsupported_architecture_is_refused_unless_forced(model_type, overrides, match):
    from lola.integrations.transformers import apply_lola

    model = tiny_model(model_type, **{**OTHER_KEYS.get(model_type, {}), **overrides})
    with pytest.raises(ValueError, match=match + ".*force=True"):
        apply_lola(model, lola.LoLAConfig())
    assert getattr(model, "_lola", None) is None and model.config._attn_implementation == "eager"


def test_force_applies_lola_to_an_unverified_architecture():
    from lola.integrations.transformers import apply_lola, remove_lola

    model = tiny_model("opt", **OTHER_KEYS["opt"])
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=0, sinks=0), force=True)
    assert model._lola is not None and all(hasattr(m, "lola") for m in model.modules() if type(m).__name__ == "OPTAttention")
    remove_lola(model)


@pytest.mark.parametrize("model_type, overrides", [("qwen3", {}), ("gemma2", {"attn_logit_softcapping": None}), ("gemma3_text", {})])
def test_verified_architectures_reproduce_stock_attention(model_type, overrides):
    # With a window that covers the sequence and softmax_only mixing, LoLA is exact attention:
    # the logits must equal the stock ones (the check behind VERIFIED_MODEL_TYPES).
    from lola.integrations.transformers import patch

    model = tiny_model(model_type, **overrides)
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "q_proj"):
                m.q_proj.weight.mul_(12)  # peaked attention: a wrong scale or rotation shows
        ids = torch.randint(0, 101, (1, 24), generator=torch.Generator().manual_seed(1))
        ref = model(ids).logits
        with patch(model, lola.LoLAConfig(window=32, sparse_size=0, sinks=0, chunk=32, mixing="softmax_only")):
            out = model(ids, use_cache=False).logits
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


# -- 4-D masks: honoured where they are causal + padding, refused otherwise ------------------------


def _block_causal(spans: list[tuple[int, int]], n: int) -> torch.Tensor:
    mask = torch.zeros(1, 1, n, n, dtype=torch.bool)
    for a, b in spans:
        for i in range(a, b):
            mask[0, 0, i, a : i + 1] = True
    return mask


@pytest.mark.parametrize("additive", [False, True], ids=["bool", "additive"])
def test_a_4d_mask_of_packed_sequences_is_refused_naming_it(additive):
    # Read as padding only, the second sequence would attend to the first (logits 0.575 off).
    from tests.hostile.common import ids, tiny_lola

    mask = _block_causal([(0, 5), (5, 10)], 10)
    if additive:
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    with pytest.raises(ValueError, match=r"attention_mask: the 4-D mask is more than causal attention .* packed sequences"):
        tiny_lola()(ids(10), attention_mask=mask)


def test_a_4d_mask_of_causal_attention_with_padding_is_honoured():
    from tests.hostile.common import ids, tiny_lola

    model, x = tiny_lola(), ids(10)
    mask = _block_causal([(3, 10)], 10)  # three left-padding tokens, then one causal sequence
    with torch.no_grad():
        four = model(x, attention_mask=mask).logits
        two = model(x, attention_mask=torch.tensor([[0, 0, 0] + [1] * 7])).logits
    assert torch.allclose(four[:, 3:], two[:, 3:], atol=1e-6, rtol=0)


def test_packed_sequences_found_in_position_ids_are_refused():
    # transformers builds a block-diagonal mask from position_ids that restart (no 2-D mask):
    # lola's own mask function must not pass it as causal + padding.
    from tests.hostile.common import ids, tiny_lola

    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4]])
    with pytest.raises(ValueError, match=r"attention_mask: the 4-D mask is more than causal attention"):
        tiny_lola()(ids(10), position_ids=positions, use_cache=False)


@pytest.mark.parametrize("value", [1.0, -0.5])
def test_a_float_4d_mask_that_is_not_additive_is_refused(value):
    # 1/0 floats read as additive would invert the mask; a soft bias cannot be honoured
    from tests.hostile.common import ids, tiny_lola

    mask = _block_causal([(0, 10)], 10).float()
    mask = torch.where(mask.bool(), torch.zeros(()), torch.full((), value))
    with pytest.raises(ValueError, match=r"attention_mask: a float 4-D mask is additive"):
        tiny_lola()(ids(10), attention_mask=mask, use_cache=False)
