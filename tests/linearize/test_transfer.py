"""Attention transfer on a tiny random model: loss goes down, files, resume, loading, refusal."""

import json

import pytest
import torch

import lola
from lola.cli import main
from lola.integrations.transformers import LoLACache, apply_lola, remove_lola
from lola.io.provenance import versions
from lola.linearize import LinearizeConfig, linearize, read_feature_maps
from lola.linearize.transfer import CHECKPOINT_FILE
from lola.models import tiny_random

CFG = LinearizeConfig(steps=12, chunk_tokens=96, train_chunks=3, eval_chunks=1, window=8, checkpoint_every=4, lr=3e-2, text=["pydoc"])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("maps")
    model, tok = tiny_random()
    report = linearize(model, tok, CFG, out, model_name="tiny", progress=False, log=lambda s: None)
    return out, report


def test_loss_goes_down_and_files_are_written(trained):
    out, report = trained
    assert report["mse_heldout_mean"]["after"] < report["mse_heldout_mean"]["before"]
    assert {p.name for p in out.iterdir()} >= {"feature_maps.safetensors", "lola_config.json", "report.json", CHECKPOINT_FILE}
    saved = json.loads((out / "report.json").read_text())
    assert saved["steps"] == 12 and len(saved["train_loss"]["every_step"]) == 12
    assert set(saved["mse_heldout_before"]) == {"0", "1"} and saved["versions"]["torch"] == torch.__version__
    maps = read_feature_maps(out)
    assert maps.geometry == {"num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16}
    assert maps.config.window == 8 and maps.config.sparse_size == 0


def test_resume_continues_where_it_stopped(tmp_path, monkeypatch):
    import lola.linearize.transfer as transfer

    model, tok = tiny_random()
    real, calls = transfer.layer_loss, []

    def interrupted(*args):
        calls.append(1)
        if len(calls) > 2 + 2 * 8:  # the 2-layer held-out eval, then 8 training steps
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(transfer, "layer_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        linearize(model, tok, CFG, tmp_path / "a", progress=False, log=lambda s: None)
    assert torch.load(tmp_path / "a" / CHECKPOINT_FILE, weights_only=True)["step"] == 8
    monkeypatch.setattr(transfer, "layer_loss", real)
    logs = []
    resumed = linearize(model, tok, CFG, tmp_path / "a", progress=False, log=logs.append)
    whole = linearize(model, tok, CFG, tmp_path / "b", progress=False, log=lambda s: None)
    assert any("resuming from step 8" in line for line in logs)
    assert len(resumed["train_loss"]["every_step"]) == 12
    assert resumed["train_loss"]["every_step"] == pytest.approx(whole["train_loss"]["every_step"], rel=1e-5)
    a, b = read_feature_maps(tmp_path / "a").tensors, read_feature_maps(tmp_path / "b").tensors
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


def test_resume_with_other_options_is_refused(tmp_path):
    model, tok = tiny_random()
    linearize(model, tok, CFG.model_copy(update={"steps": 4}), tmp_path, progress=False, log=lambda s: None)
    with pytest.raises(ValueError, match="other options"):
        linearize(model, tok, CFG.model_copy(update={"lr": 1e-3}), tmp_path, progress=False, log=lambda s: None)


def test_apply_lola_loads_the_trained_maps(trained):
    out, _ = trained
    model, tok = tiny_random()
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4, sinks=1), feature_maps=out)
    maps = read_feature_maps(out)
    attn = model._lola.modules[1]
    torch.testing.assert_close(attn.feature_map_q.mlp.layer.detach(), maps.tensors["model.layers.1.self_attn.feature_map_q.mlp.layer"])
    torch.testing.assert_close(attn.window_factors.detach().flatten(), maps.tensors["model.layers.1.self_attn.window_factors"].flatten())
    # LoLA (a sparse cache) on maps trained with lolcats reads them with the paper's rule
    assert maps.config.mixing == "lolcats" and model._lola.config.mixing == "lola_authors"
    ids = tok("The quick brown fox jumps over the lazy dog. " * 4, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.isfinite(model(ids, cache=LoLACache(model)).logits).all()
    remove_lola(model)


def test_the_hybrid_reduces_the_error_of_the_real_layers(trained):
    """The trained maps, run through apply_lola's real LoLA layers (Tokenwise, no sparse
    cache), imitate the model's attention outputs better than the untrained ones."""
    out, _ = trained
    model, tok = tiny_random()
    ids = tok("Held-out check: " + "lorem ipsum dolor sit amet " * 8, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        full = model(ids).logits
        errors = []
        for maps in (None, out):
            apply_lola(
                model,
                lola.LoLAConfig(window=8, sparse_size=0, sinks=0, schedule="tokenwise", mixing="lolcats", feature_map="hedgehog_identity"),
                feature_maps=maps,
            )
            errors.append((model(ids, cache=LoLACache(model)).logits - full).square().mean().item())
            remove_lola(model)
    assert errors[1] < errors[0]


def test_feature_maps_for_another_model_are_refused(trained):
    from transformers import LlamaConfig, LlamaForCausalLM

    out, _ = trained
    other = LlamaForCausalLM(
        LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
    )
    with pytest.raises(ValueError, match="num_layers: maps 2 vs model 3"):
        apply_lola(other, lola.LoLAConfig(), feature_maps=out)
    assert getattr(other, "_lola", None) is None


def test_conflicting_feature_map_is_refused(trained):
    out, _ = trained
    model, _ = tiny_random()
    with pytest.raises(ValueError, match="feature_map='elu' conflicts"):
        apply_lola(model, lola.LoLAConfig(feature_map="elu"), feature_maps=out)


def test_missing_or_foreign_folder_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_feature_maps(tmp_path / "nope")
    (tmp_path / "feature_maps.safetensors").write_bytes(b"")
    (tmp_path / "lola_config.json").write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match="not a lola feature-map description"):
        read_feature_maps(tmp_path)


def test_cli_quick_run_and_niah_with_feature_maps(tmp_path, capsys):
    out = tmp_path / "maps"
    assert main(["linearize", "--quick", "--out", str(out)]) == 0
    assert (out / "feature_maps.safetensors").is_file()
    assert (
        main(
            [
                "perplexity",
                "--model",
                "tiny-random-llama",
                "--feature-maps",
                str(out),
                "--length",
                "64",
                "--windows",
                "1",
                "--window",
                "16",
                "--sparse-size",
                "4",
                "--text",
                "pydoc",
                "--generate",
                "8",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "hybrid" in text and "lola" in text and "x)" in text and "repeated 4-grams" in text
    assert "(lolcats)" in text and "(lola_authors)" in text  # the hybrid's trained rule, LoLA's default
    small = ["perplexity", "--model", "tiny-random-llama", "--feature-maps", str(out), "--length", "64", "--windows", "1", "--text", "pydoc"]
    assert main([*small, "--methods", "lola", "--generate", "0", "--mixing", "softmax_only", "--out", str(tmp_path / "ppl.json")]) == 0
    assert "(softmax_only)" in capsys.readouterr().out
    assert json.loads((tmp_path / "ppl.json").read_text())["versions"] == versions()
    with pytest.raises(SystemExit) as refused:  # the rule's choices come from the run's spec
        main([*small, "--mixing", "average"])
    assert refused.value.code == 2 and "--mixing: invalid choice: 'average'" in capsys.readouterr().err
    assert main(["niah", "--model", "tiny-random-llama", "--feature-maps", str(tmp_path / "nope"), "--out", str(tmp_path / "n")]) == 2
    assert "not a feature-map folder" in capsys.readouterr().err


def test_niah_methods_take_the_default_rule_per_method_unless_told_otherwise(trained):
    from lola.eval.runner import NiahRun, method_configs

    out, _ = trained
    small = dict(window=8, sparse_size=8, sinks=2, chunk=8, budgets="uniform", policies=["sre"], methods=["full", "window", "hybrid", "lola"])
    cfgs = method_configs(NiahRun(feature_maps=str(out), **small))
    assert "mixing" not in cfgs["hybrid"].model_fields_set and "mixing" not in cfgs["lola-sre"].model_fields_set
    assert cfgs["window"].mixing == "softmax_only"
    model, _ = tiny_random()
    apply_lola(model, cfgs["hybrid"], feature_maps=out)
    assert model._lola.config.mixing == "lolcats" == read_feature_maps(out).config.mixing  # the hybrid as trained
    remove_lola(model)
    apply_lola(model, cfgs["lola-sre"], feature_maps=out)
    assert model._lola.config.mixing == "lola_authors"  # LoLA: the paper's rule
    remove_lola(model)
    told = method_configs(NiahRun(feature_maps=str(out), mixing="softmax_only", **small))
    apply_lola(model, told["lola-sre"], feature_maps=out)
    assert model._lola.config.mixing == "softmax_only"
    remove_lola(model)
    # without feature maps: softmax_only for lola, lola_authors for the hybrid (as before)
    plain = method_configs(NiahRun(feature_maps=None, **small))
    assert plain["lola-sre"].mixing == "softmax_only" and plain["hybrid"].mixing == "lola_authors"


def test_niah_records_the_configs_the_methods_really_ran(trained, tmp_path, capsys):
    """results.json shows each method's config after the feature maps filled in their fields."""
    out, _ = trained
    folder = tmp_path / "n"
    args = ["niah", "--model", "tiny-random-llama", "--feature-maps", str(out), "--methods", "hybrid", "lola"]
    assert main([*args, "--lengths", "512", "--samples", "1", "--out", str(folder)]) == 0
    methods = json.loads((folder / "results.json").read_text())["methods"]
    trained_cfg = read_feature_maps(out).config
    assert methods["hybrid"]["mixing"] == trained_cfg.mixing == "lolcats"
    assert methods["lola-sre"]["mixing"] == "lola_authors"
    assert "mixing rules: hybrid lolcats, lola-sre lola_authors" in capsys.readouterr().out
    for name in ("hybrid", "lola-sre"):
        assert methods[name]["feature_map"] == trained_cfg.feature_map


def test_perplexity_runs_each_method_with_its_rule_and_measures_the_state_share(trained):
    """lola perplexity: the hybrid reads its trained rule, LoLA the paper's (or --mixing); the
    linear state's share is 0 for softmax_only and strictly between 0 and 1 for the rules that mix."""
    from lola.eval.perplexity import PerplexityRun, format_perplexity, run_perplexity

    out, _ = trained
    model, tok = tiny_random()
    small = dict(
        model="tiny-random-llama", lengths=[96], windows=1, window=8, sparse_size=4, sinks=1, chunk=8, text=["pydoc"], generate=0, feature_maps=str(out)
    )
    res = run_perplexity(PerplexityRun(methods=["full", "hybrid", "lola"], **small), model, tok, progress=False)
    assert res["hybrid"][96]["mixing"] == "lolcats" and res["lola"][96]["mixing"] == "lola_authors"
    assert "linear_share" not in res["full"][96]
    for m in ("hybrid", "lola"):
        per_layer = res[m][96]["linear_share_per_layer"]
        assert set(per_layer) == {0, 1} and all(0 < x < 1 for x in per_layer.values())
        assert res[m][96]["linear_share"] == pytest.approx(sum(per_layer.values()) / 2)
    exact = run_perplexity(PerplexityRun(methods=["lola"], mixing="softmax_only", **small), model, tok, progress=False)
    assert exact["lola"][96]["mixing"] == "softmax_only" and exact["lola"][96]["linear_share"] == 0
    assert exact["lola"][96]["ppl"] != res["lola"][96]["ppl"]  # the state changed the outputs
    text = format_perplexity({**res, "lola-exact": exact["lola"]})
    assert "share of the outputs from the linear state" in text and "(lola_authors)" in text and "(softmax_only)" in text


def test_lm_eval_model_args_take_the_same_default(trained):
    from lola.integrations.lm_eval.model import lola_config_from_args

    out, _ = trained
    cfg, maps = lola_config_from_args(None, model_name="tiny-random-llama", feature_maps=str(out), budgets="uniform", window=8, sparse_size=4)
    assert cfg.mixing == "lola_authors" and maps.config.mixing == "lolcats"
    hybrid, _ = lola_config_from_args(None, model_name="tiny-random-llama", feature_maps=str(out), budgets="uniform", window=8, sparse_size=0)
    assert hybrid.mixing == "lolcats"
    told, _ = lola_config_from_args(None, model_name="tiny-random-llama", feature_maps=str(out), budgets="uniform", sparse_size=4, mixing="lolcats")
    assert told.mixing == "lolcats"


def test_state_positions_must_move_something():
    with pytest.raises(ValueError, match="state_positions=96 moves no query or key of a 96-token chunk"):
        CFG.model_validate({**CFG.model_dump(), "state_positions": 96})
    with pytest.raises(ValueError, match="state_positions"):
        CFG.model_validate({**CFG.model_dump(), "state_positions": 0})


def test_maps_trained_at_state_positions_1_see_the_model_s_unrotated_queries_and_keys():
    """The moved inputs are the model's own projections before RoPE, taken from q_proj/k_proj."""
    from lola.linearize.hybrid import state_features
    from lola.linearize.teacher import collect_activations
    from lola.linearize.transfer import state_mover

    model, _ = tiny_random()
    ids = torch.randint(0, 200, (1, 40), generator=torch.Generator().manual_seed(0))
    acts = collect_activations(model, ids, dtype=torch.float32)[0][1]
    attn_module = model.model.layers[1].self_attn
    seen = {}
    hooks = [getattr(attn_module, n).register_forward_hook(lambda m, i, o, n=n: seen.__setitem__(n, o)) for n in ("q_proj", "k_proj")]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    q_pre = seen["q_proj"].view(1, 40, 4, 16).transpose(1, 2)
    k_pre = seen["k_proj"].view(1, 40, 2, 16).transpose(1, 2).repeat_interleave(2, dim=1)
    student = lola.compose(lola.LoLAConfig(window=8, sparse_size=0, sinks=0, schedule="tokenwise", mixing="lolcats"), num_heads=4, head_dim=16, num_kv_heads=2)
    with torch.no_grad():
        student.feature_map_q.mlp.layer.add_(0.3 * torch.randn_like(student.feature_map_q.mlp.layer))
        mover = state_mover(model, CFG.model_copy(update={"state_positions": 1}))
        fq, fk = state_features(student, acts.q, acts.k.repeat_interleave(2, dim=1), mover, torch.arange(40)[None])
        torch.testing.assert_close(fq, student.feature_map_q(q_pre), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(fk, student.feature_map_k(k_pre), rtol=1e-4, atol=1e-5)
        rotated, _ = state_features(student, acts.q, acts.k.repeat_interleave(2, dim=1), None, torch.arange(40)[None])
        assert (rotated - fq).abs().max() > 1e-3  # (the model's RoPE moved them: the check can fail)


def test_maps_trained_for_a_bounded_state_are_read_at_it(tmp_path):
    model, tok = tiny_random()
    cfg = CFG.model_copy(update={"steps": 4, "state_positions": 1})
    report = linearize(model, tok, cfg, tmp_path, progress=False, log=lambda s: None)
    assert report["mse_heldout_mean"]["after"] < report["mse_heldout_mean"]["before"]
    maps = read_feature_maps(tmp_path)
    assert (maps.config.positions, maps.config.state_positions) == ("bounded", 1)
    assert maps.config.state_key_positions == "clamped"  # keys past the limit sat at it during training
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4, sinks=1), feature_maps=tmp_path)
    assert all(attn.positions.state_positions == 1 for attn in model._lola.modules.values())
    ids = tok("The quick brown fox jumps over the lazy dog. " * 4, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.isfinite(model(ids, cache=LoLACache(model)).logits).all()
    remove_lola(model)
    for field, value in (("positions", "absolute"), ("state_positions", 64)):
        with pytest.raises(ValueError, match=f"config.{field}={value!r} conflicts with the feature maps"):
            apply_lola(
                model,
                lola.LoLAConfig(window=8, sparse_size=4, sinks=1, **({"positions": "bounded"} if field != "positions" else {}), **{field: value}),
                feature_maps=tmp_path,
            )
    # a resume with the state's positions changed is another run
    with pytest.raises(ValueError, match="other options"):
        linearize(model, tok, cfg.model_copy(update={"state_positions": 2}), tmp_path, progress=False, log=lambda s: None)


def test_stage1_loss_reads_the_state_as_a_bounded_layer_does(tmp_path, monkeypatch):
    """``layer_loss`` with the mover equals the MSE of LoLA's own bounded layer (the inference
    path, tokenwise) on the same activations, and ``linearize`` trains and evaluates with it."""
    import dataclasses

    import lola.linearize.transfer as transfer
    from lola.linearize.teacher import collect_activations
    from lola.linearize.transfer import layer_loss, state_mover

    model, tok = tiny_random()
    ids = torch.randint(0, 200, (1, 40), generator=torch.Generator().manual_seed(1))
    acts = collect_activations(model, ids, dtype=torch.float32)[0][0]
    # (the tiny model's queries and keys are small: larger ones make the maps tell positions apart)
    acts = dataclasses.replace(acts, q=8 * acts.q, k=8 * acts.k)
    cfg = CFG.model_copy(update={"state_positions": 3})
    mover = state_mover(model, cfg)
    base = dict(window=8, sparse_size=0, sinks=0, schedule="tokenwise", mixing="lolcats")
    student = lola.compose(lola.LoLAConfig(**base), num_heads=4, head_dim=16, num_kv_heads=2)
    bounded = lola.compose(
        lola.LoLAConfig(**base, positions="bounded", exact_distance=64, state_positions=3), num_heads=4, head_dim=16, num_kv_heads=2, rotary=mover.rotary
    )
    with torch.no_grad():
        student.feature_map_q.mlp.layer.add_(0.3 * torch.randn_like(student.feature_map_q.mlp.layer))
        student.feature_map_k.mlp.layer.add_(0.3 * torch.randn_like(student.feature_map_k.mlp.layer))
        student.window_factors.normal_()
        bounded.load_state_dict(student.state_dict())
        y, _ = bounded(acts.q.transpose(1, 2), acts.k.transpose(1, 2), acts.v.transpose(1, 2))
        expected = 1000.0 * torch.mean((y.transpose(1, 2).float() - acts.y) ** 2)
        assert float(layer_loss(student, acts, 8, mover)) == pytest.approx(float(expected), rel=1e-4)
        assert float(layer_loss(student, acts, 8, None)) != pytest.approx(float(expected), rel=1e-3)  # (the move matters here)
    movers, real = [], transfer.layer_loss
    monkeypatch.setattr(transfer, "layer_loss", lambda *args: movers.append(args[3]) or real(*args))
    linearize(model, tok, cfg.model_copy(update={"steps": 1}), tmp_path, progress=False, log=lambda s: None)
    assert movers and all(m is not None and m.state_positions == 3 for m in movers)  # held-out evals and the step


def test_spread_positions_cover_the_context_with_a_chunk_s_distances():
    from lola.linearize.transfer import spread_positions

    cfg = CFG.model_copy(update={"position_spread": 1000})  # chunks of 96
    assert spread_positions(CFG, 0) is None
    highest = []
    for index in [*range(40), -1, -2]:
        pos = spread_positions(cfg, index)
        steps = pos.diff()
        assert pos.shape == (96,) and pos[0] == 0 and int(pos.max()) <= 999 and bool((steps >= 1).all())
        assert int((steps > 1).sum()) <= 1  # two runs of consecutive positions, one skip between them
        assert torch.equal(pos, spread_positions(cfg, index))  # the same chunk, the same positions (resume)
        highest.append(int(pos.max()))
    assert max(highest) > 800 and len(set(highest)) > 30
    tight = CFG.model_copy(update={"position_spread": 97})  # one position more than a chunk: the skip is 0 or 1
    assert {int(spread_positions(tight, i).max()) for i in range(60)} == {95, 96}
    assert spread_positions(CFG.model_copy(update={"position_spread": 500, "seed": 2**62}), 0).shape == (96,)  # any seed


def test_position_spread_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="position_spread=96 spreads a 96-token chunk"):
        CFG.model_validate({**CFG.model_dump(), "position_spread": 96})
    with pytest.raises(ValueError, match="give one of them"):
        CFG.model_validate({**CFG.model_dump(), "position_spread": 500, "state_positions": 1})
    model, tok = tiny_random()
    too_far = model.config.max_position_embeddings + 1
    with pytest.raises(ValueError, match=f"position_spread \\(--position-spread\\) {too_far} is longer than the model's"):
        linearize(model, tok, CFG.model_copy(update={"position_spread": too_far}), tmp_path / "out", progress=False, log=lambda s: None)
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_the_teacher_runs_at_the_spread_positions_and_the_folder_is_read_at_them(tmp_path, monkeypatch):
    """The teacher's queries at PoSE positions are its queries at 0 … T − 1 rotated by the
    offsets (the model's own rotation, checked with lola's); linearize hands it those positions."""
    import lola.linearize.transfer as transfer
    from lola.core.positions import RotaryEmbedding
    from lola.linearize.teacher import collect_activations
    from lola.linearize.transfer import spread_positions

    model, tok = tiny_random()
    cfg = CFG.model_copy(update={"position_spread": 400, "steps": 2})
    ids = torch.randint(0, 200, (1, 96), generator=torch.Generator().manual_seed(0))
    pos = spread_positions(cfg, 3)
    # (layer 0: its inputs do not depend on positions, only its rotation does)
    at_pose = collect_activations(model, ids, dtype=torch.float32, position_ids=pos[None])[0][0]
    at_zero = collect_activations(model, ids, dtype=torch.float32)[0][0]
    moved = RotaryEmbedding.from_model(model).rotate(at_zero.q, (pos - torch.arange(96))[None, None, :])
    torch.testing.assert_close(at_pose.q, moved, rtol=1e-4, atol=1e-5)
    assert (at_pose.q - at_zero.q).abs().max() > 1e-3
    # its target is causal attention over the whole chunk by index, across the skip (not two sequences)
    q, k, v = at_pose.q, *(x.repeat_interleave(2, dim=1) for x in (at_pose.k, at_pose.v))
    scores = (q @ k.transpose(-1, -2)) * 16**-0.5
    causal = torch.ones(96, 96, dtype=torch.bool).tril()
    torch.testing.assert_close(at_pose.y, torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v, rtol=1e-4, atol=1e-5)
    seen, real = [], transfer.collect_activations
    monkeypatch.setattr(transfer, "collect_activations", lambda m, chunks, **kw: seen.append(kw.get("position_ids")) or real(m, chunks, **kw))
    linearize(model, tok, cfg, tmp_path, progress=False, log=lambda s: None)
    assert seen and all(p is not None and int(p.max()) < 400 for p in seen) and any(int(p.max()) >= 96 for p in seen)
    maps = read_feature_maps(tmp_path)
    assert (maps.config.positions, maps.config.state_positions) == ("bounded", 400)
    assert maps.config.state_key_positions == "spread"  # past 400 keys stay at distances PoSE trained
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4, sinks=1), feature_maps=tmp_path)
    assert all(attn.positions.state_positions == 400 for attn in model._lola.modules.values())
    assert all(attn.positions.key_spread is not None for attn in model._lola.modules.values())  # the read spreads them
    remove_lola(model)
