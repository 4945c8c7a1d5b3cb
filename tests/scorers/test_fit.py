import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lola import models, scorers
from lola.scorers.fit import FitSpec, fit_scorer, future_targets, kvzip_targets, rank_metrics, record_targets, recording, solve_ridge

TEXT = " ".join(f"Line {i}: the {['red', 'green', 'blue'][i % 3]} fox number {i * 7 % 13} jumps over lazy dog {i}." for i in range(400))


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    return str(path)


def tiny_spec(text_file, **kw):
    base = dict(model="tiny-random-llama", text=[text_file], length=96, documents=2, heldout=1)
    if kw.get("target") != "kvzip":  # (the future target's options: refused with kvzip's)
        base |= dict(min_distance=8, min_future=16)
    return FitSpec(**{**base, **kw})


@settings(max_examples=25, deadline=None)
@given(t=st.integers(2, 12), g=st.integers(1, 3), m=st.integers(1, 12), seed=st.integers(0, 999))
def test_future_targets_are_the_largest_far_weight(t, g, m, seed):
    probs = torch.rand(g, t, t, generator=torch.Generator().manual_seed(seed)).tril()
    want = torch.zeros(t)
    for j in range(t):
        for i in range(j + m, t):
            want[j] = max(want[j], probs[:, i, j].max())
    torch.testing.assert_close(future_targets(probs.clone(), m), want)


def test_kvzip_targets_are_the_largest_weight_from_the_repetition():
    probs = torch.rand(2, 5, 9)
    want = torch.tensor([max(float(probs[h, i, j]) for h in range(2) for i in range(5)) for j in range(4)])
    torch.testing.assert_close(kvzip_targets(probs, 4), want)


def test_ridge_without_penalty_is_least_squares_and_with_it_solves_the_normal_equations():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(50, 4, generator=g, dtype=torch.float64), torch.ones(50, 1, dtype=torch.float64)], dim=1)
    y = torch.randn(50, generator=g, dtype=torch.float64)
    w0 = solve_ridge(x.T @ x, x.T @ y, 0.0)
    torch.testing.assert_close(w0, torch.linalg.lstsq(x, y[:, None]).solution[:, 0])
    w = solve_ridge(x.T @ x, x.T @ y, 0.5)
    penalty = 0.5 * torch.diag(x.T @ x)
    penalty[-1] = 0.0  # the bias is free
    grad = x.T @ (x @ w - y) + penalty * w
    assert grad.abs().max() < 1e-6


def test_rank_metrics():
    a = torch.arange(20.0)
    assert rank_metrics(a, a) == pytest.approx((1.0, 1.0))
    rho, rec = rank_metrics(-a, a)
    assert rho == pytest.approx(-1.0) and rec == 0.0


@pytest.mark.parametrize("target", ["future", "kvzip"])
def test_recorded_targets_equal_eager_attention_weights(target, text_file):
    """The recorder's attention (its own float32 softmax) against transformers' eager weights."""
    model, tok = models.tiny_random()
    spec = tiny_spec(text_file, target=target)
    chunk = torch.randint(1, 200, (spec.length,), generator=torch.Generator().manual_seed(0))
    got = {}
    with recording(model):
        record_targets(model, tok, chunk, spec, lambda layer, head, k, v, pos, tgt: got.__setitem__((layer, head), (pos, tgt)))
    from lola.scorers.fit import _inputs

    ids, rows = _inputs(tok, chunk, spec)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attn = model(ids, output_attentions=True).attentions  # [1, H, T, T] per layer
    lo, hi = spec.keys()
    assert sorted(got) == [(layer, h) for layer in range(2) for h in range(2)]
    for (layer, head), (pos, tgt) in got.items():
        a = attn[layer][0, 2 * head : 2 * head + 2].double()  # the group of K/V head `head`
        want = []
        for j in range(lo, hi):
            if target == "future":
                want.append(float(a[:, j + spec.min_distance :, j].max()) if j + spec.min_distance < a.shape[1] else 0.0)
            else:
                want.append(float(a[:, rows:, j].max()))
        assert pos.tolist() == list(range(lo, hi))
        torch.testing.assert_close(tgt.double(), torch.tensor(want, dtype=torch.float64), atol=1e-5, rtol=1e-4)


def test_fit_writes_a_scorer_with_a_held_out_report_and_resumes_to_the_same_weights(text_file, tmp_path, monkeypatch):
    import lola.scorers.fit as fit

    model, tok = models.tiny_random()
    spec = tiny_spec(text_file, documents=3)
    whole = fit_scorer(model, tok, spec, tmp_path / "whole.safetensors", progress=False)
    report = whole.info["report"]
    assert len(report["spearman"]) == 2 and len(report["spearman"][0]) == 2 and -1 <= report["mean_spearman"] <= 1
    assert report["tokens_fitted_per_head"] == 3 * (spec.keys()[1] - spec.keys()[0])
    loaded = scorers.load(tmp_path / "whole.safetensors")
    torch.testing.assert_close(loaded.weight, whole.weight)
    assert not (tmp_path / "whole.safetensors.partial").exists()

    real_save, calls = fit._save_checkpoint, []

    def stop_after_one(*args):
        real_save(*args)
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(fit, "_save_checkpoint", stop_after_one)
    out = tmp_path / "resumed.safetensors"
    with pytest.raises(KeyboardInterrupt):
        fit_scorer(model, tok, spec, out, progress=False)
    assert (tmp_path / "resumed.safetensors.partial").exists() and not out.exists()
    resumed = fit_scorer(model, tok, spec, out, progress=False)
    assert len(calls) == 3  # chunks 2 and 3 only
    torch.testing.assert_close(resumed.weight, whole.weight)
    assert model.config._attn_implementation == "sdpa"  # restored, also after the interruption


def test_a_checkpoint_of_other_settings_is_refused(text_file, tmp_path):
    import lola.scorers.fit as fit

    model, tok = models.tiny_random()
    out = tmp_path / "s.safetensors"
    spec = tiny_spec(text_file)
    fit._save_checkpoint(tmp_path / "s.safetensors.partial", spec, 1, {"xtx": torch.zeros(1), "xty": torch.zeros(1), "n": torch.zeros(1)})
    with pytest.raises(ValueError, match="holds a fit with other settings"):
        fit_scorer(model, tok, tiny_spec(text_file, ridge=0.5), out, progress=False)


def test_refusals(text_file, tmp_path):
    import lola

    model, tok = models.tiny_random()
    with pytest.raises(ValueError, match="leaves .* keys to fit"):
        fit_scorer(model, tok, tiny_spec(text_file, length=64, min_future=60), tmp_path / "a.safetensors", progress=False)
    foreign = tmp_path / "b.safetensors"
    foreign.write_text("mine")
    with pytest.raises(ValueError, match="was not written by lola fit-scorer"):
        fit_scorer(model, tok, tiny_spec(text_file), foreign, progress=False)
    lola.apply_lola(model, lola.LoLAConfig(window=8, sparse_size=8, sinks=2, chunk=8))
    with pytest.raises(ValueError, match="needs the stock attention"):
        fit_scorer(model, tok, tiny_spec(text_file), tmp_path / "c.safetensors", progress=False)


def test_the_command_fits_a_tiny_model(text_file, tmp_path, capsys):
    from lola.cli import main

    out = tmp_path / "s.safetensors"
    argv = ["fit-scorer", "--model", "tiny-random-llama", "--out", str(out), "--text", text_file, "--length", "96", "--documents", "2", "--heldout", "1"]
    assert main([*argv, "--target", "kvzip"]) == 0
    printed = capsys.readouterr().out
    assert "top-10% recall" in printed and scorers.load(out).info["target"] == "kvzip"


def test_the_command_fits_a_linearized_model_to_its_lora_merged_attention(text_file, tmp_path):
    from lola.cli import main
    from lola.pretrained.lora import merge_lora
    from tests.hostile.common import write_maps_with_lora

    lora, spec = write_maps_with_lora(tmp_path / "lin", "k_proj", seed=3)
    model, tok = models.tiny_random()
    argv = [
        "--model",
        "tiny-random-llama",
        "--text",
        text_file,
        "--length",
        "96",
        "--documents",
        "2",
        "--heldout",
        "1",
        "--min-distance",
        "8",
        "--min-future",
        "16",
    ]
    assert main(["fit-scorer", *argv, "--out", str(tmp_path / "lin.safetensors"), "--feature-maps", str(tmp_path / "lin")]) == 0
    merge_lora(model, lora, spec)
    spec = tiny_spec(text_file, feature_maps=str(tmp_path / "lin"))
    by_hand = fit_scorer(model, tok, spec, tmp_path / "hand.safetensors", progress=False)
    stock = fit_scorer(models.tiny_random()[0], tok, tiny_spec(text_file), tmp_path / "stock.safetensors", progress=False)
    torch.testing.assert_close(scorers.load(tmp_path / "lin.safetensors").weight, by_hand.weight)
    assert (by_hand.weight - stock.weight).abs().max() > 1e-3
