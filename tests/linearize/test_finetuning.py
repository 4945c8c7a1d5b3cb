"""Stage 2 (LoRA fine-tuning against the stock model) on a tiny random Llama: the loss goes down,
resume equals an uninterrupted run, the folder loads with its adapters merged, and the training
hybrid is the inference path."""

import copy
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaForCausalLM

import lola
from lola.data.text import ByteTokenizer
from lola.integrations.transformers import apply_lola, remove_lola
from lola.linearize import FinetuneConfig, LinearizeConfig, distillation_loss, finetune, linearize, read_feature_maps
from lola.linearize.finetuning import FINETUNE_CHECKPOINT_FILE, FINETUNE_REPORT_FILE
from lola.linearize.training_attention import HYBRID_ATTENTION, register_hybrid_attention
from lola.models import tiny_random

STAGE1 = LinearizeConfig(steps=4, chunk_tokens=96, train_chunks=2, eval_chunks=1, window=8, text=["pydoc"])
STAGE2 = FinetuneConfig(steps=24, seq_len=96, eval_chunks=1, warmup_steps=0, lr=3e-2, maps_lr=3e-2, checkpoint_every=4, text=["pydoc"])


def sharp_model(seed: int = 0) -> LlamaForCausalLM:
    """The tiny Llama of :func:`lola.models.tiny_random` with a larger init, so that its
    next-token distributions are peaked and the hybrid and full attention disagree measurably."""
    config = copy.deepcopy(tiny_random()[0].config)
    config.initializer_range = 0.25
    config.max_position_embeddings = 4096
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    out = tmp_path_factory.mktemp("stage1")
    linearize(sharp_model(), ByteTokenizer(), STAGE1, out, progress=False, log=lambda s: None)
    return out


def copy_folder(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_distillation_loss_is_kl_plus_cross_entropy():
    torch.manual_seed(0)
    s, t = torch.randn(2, 5, 7), torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    # independent: KL and CE term by term with explicit softmax
    p_t, p_s = torch.softmax(t, -1), torch.softmax(s, -1)
    kl = sum(float((p_t[b, i] * (p_t[b, i].log() - p_s[b, i].log())).sum()) for b in range(2) for i in range(5)) / 10
    ce = sum(-math.log(float(p_s[b, i, ids[b, i + 1]])) for b in range(2) for i in range(4)) / 8
    assert float(distillation_loss(s, t, ids, 1.0, 0.0)) == pytest.approx(kl, rel=1e-5)
    assert float(distillation_loss(s, t, ids, 0.5, 2.0)) == pytest.approx(0.5 * kl + 2.0 * ce, rel=1e-5)
    assert float(distillation_loss(t, t, ids, 1.0, 0.0)) == pytest.approx(0.0, abs=1e-6)


@torch.no_grad()
def inference_and_training(model: LlamaForCausalLM, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of ``model`` (LoLA applied) on ``ids`` through the inference path, then through
    the training hybrid, with trained-looking maps and gates (not the identity init)."""
    for attn in model._lola.modules.values():
        attn.feature_map_q.mlp.layer.add_(0.2 * torch.randn_like(attn.feature_map_q.mlp.layer))
        attn.feature_map_k.mlp.layer.add_(0.2 * torch.randn_like(attn.feature_map_k.mlp.layer))
        attn.window_factors.normal_()
    inference = model(ids).logits
    register_hybrid_attention()
    model.set_attn_implementation(HYBRID_ATTENTION)
    return inference, model(ids).logits


def test_training_hybrid_equals_the_inference_path():
    model = sharp_model()
    ids = torch.randint(1, 256, (1, 77))
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=0, sinks=0, schedule="tokenwise", feature_map="hedgehog_identity", mixing="lolcats"))
    inference, training = inference_and_training(model, ids)
    torch.testing.assert_close(training, inference, rtol=1e-4, atol=1e-4)


@settings(max_examples=8)
@given(state_positions=st.integers(1, 90), seed=st.integers(0, 2**16))
def test_training_hybrid_with_bounded_state_equals_the_inference_path(state_positions, seed):
    """Maps trained for a bounded state (``lola linearize --state-positions``): the training
    hybrid moves its state's queries and keys as LoLA's bounded layer does, positions past
    ``state_positions`` included (77 tokens; a limit of 1 reads them un-rotated)."""
    model = sharp_model()
    torch.manual_seed(seed)
    ids = torch.randint(1, 256, (1, 77))
    config = lola.LoLAConfig(window=8, sparse_size=0, sinks=0, schedule="tokenwise", mixing="lolcats", positions="bounded", state_positions=state_positions)
    apply_lola(model, config)
    inference, training = inference_and_training(model, ids)
    with torch.no_grad():
        # the moved positions matter: the same maps read at the keys' own positions differ
        absolute = [attn.positions for attn in model._lola.modules.values()]
        for attn in model._lola.modules.values():
            attn.positions = None
        unmoved = model(ids).logits
        for attn, positions in zip(model._lola.modules.values(), absolute):
            attn.positions = positions
    torch.testing.assert_close(training, inference, rtol=1e-4, atol=1e-4)
    if state_positions < 77 - 8:  # some key enters the state past the limit
        assert (unmoved - inference).abs().max() > 1e-3


def test_training_hybrid_refuses_what_it_cannot_compute():
    model = sharp_model()
    apply_lola(model, lola.LoLAConfig(window=8, sparse_size=4, sinks=0))
    register_hybrid_attention()
    model.set_attn_implementation(HYBRID_ATTENTION)
    with pytest.raises(ValueError, match="sparse_size=0"):
        model(torch.randint(1, 256, (1, 20)))


def test_stage2_lowers_the_kl_and_writes_a_loadable_folder(stage1, tmp_path):
    out = copy_folder(stage1, tmp_path / "run")
    report = finetune(sharp_model(), ByteTokenizer(), STAGE2, out, progress=False, log=lambda s: None)
    assert report["kl_heldout"]["after"] < 0.9 * report["kl_heldout"]["before"], report["kl_heldout"]
    assert len(report["train_loss"]["every_step"]) == 24
    assert {p.name for p in out.iterdir()} >= {
        "lora.safetensors",
        "feature_maps.safetensors",
        "lola_config.json",
        FINETUNE_REPORT_FILE,
        FINETUNE_CHECKPOINT_FILE,
    }
    saved = json.loads((out / FINETUNE_REPORT_FILE).read_text())
    assert saved["kl_heldout"] == report["kl_heldout"]

    maps = read_feature_maps(out)
    assert maps.lora_spec.rank == 8 and len(maps.lora) == 2 * 4 * 2  # A and B, q k v o, 2 layers
    # the folder reproduces the trained student through the inference path (LoRA merged into the
    # projections, maps loaded, LoLA's own memories): the same held-out KL as the training report
    from lola.data.text import encode, load_text, split_text

    ids = encode(ByteTokenizer(), split_text(load_text("pydoc"))[1])[None, :96]
    model = sharp_model()
    with torch.no_grad():
        stock = model(ids).logits
    before = {k: v.clone() for k, v in model.state_dict().items()}
    apply_lola(model, lola.LoLAConfig(sparse_size=0, window=8, sinks=0, schedule="tokenwise"), feature_maps=out)
    with torch.no_grad():
        hybrid = model(ids).logits
    assert float(distillation_loss(hybrid, stock, ids, 1.0, 0.0)) == pytest.approx(report["kl_heldout"]["after"], rel=1e-4)
    remove_lola(model)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # remove_lola restores the stock weights bit for bit


def test_stage2_resume_equals_an_uninterrupted_run(stage1, tmp_path, monkeypatch):
    import lola.linearize.finetuning as ft

    whole = finetune(sharp_model(), ByteTokenizer(), STAGE2, copy_folder(stage1, tmp_path / "whole"), progress=False, log=lambda s: None)
    part = copy_folder(stage1, tmp_path / "part")
    real, calls = ft.distillation_loss, []

    def interrupted(*args):
        calls.append(1)
        if len(calls) > 1 + 8:  # the held-out KL, then 8 training steps
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(ft, "distillation_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        finetune(sharp_model(), ByteTokenizer(), STAGE2, part, progress=False, log=lambda s: None)
    assert torch.load(part / FINETUNE_CHECKPOINT_FILE, weights_only=True)["step"] == 8
    monkeypatch.setattr(ft, "distillation_loss", real)
    logs = []
    resumed = finetune(sharp_model(), ByteTokenizer(), STAGE2, part, progress=False, log=logs.append)
    assert any("resuming stage 2 from step 8" in line for line in logs)
    assert resumed["train_loss"]["every_step"] == pytest.approx(whole["train_loss"]["every_step"], rel=1e-4)
    a, b = read_feature_maps(tmp_path / "whole"), read_feature_maps(part)
    for k in a.lora:
        torch.testing.assert_close(b.lora[k], a.lora[k], rtol=1e-4, atol=1e-6)
    for k in a.tensors:
        torch.testing.assert_close(b.tensors[k], a.tensors[k], rtol=1e-4, atol=1e-6)


def test_stage2_refusals(stage1, tmp_path):
    with pytest.raises(FileNotFoundError, match="stage-1"):
        finetune(sharp_model(), ByteTokenizer(), STAGE2, tmp_path / "empty", progress=False, log=lambda s: None)
    out = copy_folder(stage1, tmp_path / "run")
    finetune(sharp_model(), ByteTokenizer(), STAGE2.model_copy(update={"steps": 2, "checkpoint_every": 1}), out, progress=False, log=lambda s: None)
    with pytest.raises(ValueError, match="other options"):
        finetune(sharp_model(), ByteTokenizer(), STAGE2.model_copy(update={"steps": 2, "lr": 1e-4}), out, progress=False, log=lambda s: None)
    with pytest.raises(ValueError, match="beyond --stage2-steps 1"):
        finetune(sharp_model(), ByteTokenizer(), STAGE2.model_copy(update={"steps": 1, "checkpoint_every": 1}), out, progress=False, log=lambda s: None)
    data = (out / FINETUNE_CHECKPOINT_FILE).read_bytes()
    (out / FINETUNE_CHECKPOINT_FILE).write_bytes(data[: len(data) // 3])
    with pytest.raises(ValueError, match="checkpoint-stage2.pt does not match its checksum"):
        finetune(sharp_model(), ByteTokenizer(), STAGE2.model_copy(update={"steps": 2, "checkpoint_every": 1}), out, progress=False, log=lambda s: None)
    (out / FINETUNE_CHECKPOINT_FILE).unlink()
    with pytest.raises(ValueError, match="already holds stage-2 LoRA"):
        finetune(sharp_model(), ByteTokenizer(), STAGE2, out, progress=False, log=lambda s: None)


# Stage 2 through LoLA as it runs at inference (FinetuneConfig.lola), and continuing from a stage-2
# folder (from_lora).
THROUGH_LOLA = lola.LoLAConfig(window=8, sparse_size=8, sinks=2, chunk=8, mixing="lola_authors")


def heldout_ids():
    from lola.data.text import encode, load_text, split_text

    return encode(ByteTokenizer(), split_text(load_text("pydoc"))[1])[None, :96]


def kl_through(folder, config):
    """KL(stock ‖ the folder read through ``config``) on the held-out chunk, by the inference path."""
    ids, model = heldout_ids(), sharp_model()
    with torch.no_grad():
        stock = model(ids).logits
        apply_lola(model, config, feature_maps=folder)
        return float(distillation_loss(model(ids).logits, stock, ids, 1.0, 0.0))


def test_stage2_through_lola_trains_the_inference_path(stage1, tmp_path):
    out = copy_folder(stage1, tmp_path / "run")
    # (the hybrid's learning rate overshoots here: the exact tokens already carry most outputs)
    cfg = STAGE2.model_copy(update={"steps": 24, "lr": 1e-3, "maps_lr": 1e-3, "lola": THROUGH_LOLA})
    report = finetune(sharp_model(), ByteTokenizer(), cfg, out, progress=False, log=lambda s: None)
    assert report["kl_heldout"]["after"] < report["kl_heldout"]["before"], report["kl_heldout"]
    # the student trained and measured in training is LoLA as the folder runs at inference
    # (sparse cache, sinks, chunkwise SRE, lola_authors), read back through apply_lola
    assert kl_through(out, THROUGH_LOLA) == pytest.approx(report["kl_heldout"]["after"], rel=1e-4)
    assert kl_through(stage1, THROUGH_LOLA) == pytest.approx(report["kl_heldout"]["before"], rel=1e-4)
    # the folder still describes the hybrid its maps came from; the training attention is reported
    maps = read_feature_maps(out)
    assert maps.config.sparse_size == 0 and maps.config.mixing == read_feature_maps(stage1).config.mixing
    assert report["config"]["lola"]["sparse_size"] == 8 and report["student_config"]["mixing"] == "lola_authors"
    assert report["student_config"]["feature_map"] == maps.config.feature_map  # the trained maps were in the student


def test_stage2_through_lola_resumes_like_an_uninterrupted_run(stage1, tmp_path, monkeypatch):
    import lola.linearize.finetuning as ft

    cfg = STAGE2.model_copy(update={"steps": 6, "checkpoint_every": 3, "lola": THROUGH_LOLA})
    whole = finetune(sharp_model(), ByteTokenizer(), cfg, copy_folder(stage1, tmp_path / "whole"), progress=False, log=lambda s: None)
    part = copy_folder(stage1, tmp_path / "part")
    real, calls = ft.distillation_loss, []

    def interrupted(*args):
        calls.append(1)
        if len(calls) > 1 + 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(ft, "distillation_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        finetune(sharp_model(), ByteTokenizer(), cfg, part, progress=False, log=lambda s: None)
    monkeypatch.setattr(ft, "distillation_loss", real)
    with pytest.raises(ValueError, match="other options"):  # another LoLA config is another run
        finetune(sharp_model(), ByteTokenizer(), cfg.model_copy(update={"lola": THROUGH_LOLA.model_copy(update={"sparse_size": 4})}), part, progress=False)
    resumed = finetune(sharp_model(), ByteTokenizer(), cfg, part, progress=False, log=lambda s: None)
    assert resumed["train_loss"]["every_step"] == pytest.approx(whole["train_loss"]["every_step"], rel=1e-4)


@pytest.fixture(scope="module")
def stage2(stage1, tmp_path_factory):
    out = copy_folder(stage1, tmp_path_factory.mktemp("stage2") / "run")
    finetune(sharp_model(), ByteTokenizer(), STAGE2.model_copy(update={"steps": 4}), out, progress=False, log=lambda s: None)
    return out


def test_from_lora_starts_where_the_folder_ends(stage2, tmp_path):
    cfg = STAGE2.model_copy(update={"steps": 2, "from_lora": True, "lola": THROUGH_LOLA})
    report = finetune(sharp_model(), ByteTokenizer(), cfg, tmp_path / "continued", maps=stage2, progress=False, log=lambda s: None)
    # before any step the student is the stage-2 folder (its LoRA merged, its maps) read by LoLA
    assert report["kl_heldout"]["before"] == pytest.approx(kl_through(stage2, THROUGH_LOLA), rel=1e-4)
    assert kl_through(tmp_path / "continued", THROUGH_LOLA) == pytest.approx(report["kl_heldout"]["after"], rel=1e-4)
    assert "start" in report["inputs"]
    # what it started from travels with it: stage 1's report as it is, stage 2's inside its own
    saved = json.loads((tmp_path / "continued" / FINETUNE_REPORT_FILE).read_text())
    assert saved["continued_from"] == json.loads((stage2 / FINETUNE_REPORT_FILE).read_text())
    assert (tmp_path / "continued" / "report.json").read_text() == (stage2 / "report.json").read_text()
    read_feature_maps(tmp_path / "continued")  # and the folder's checksums cover them


def test_from_lora_refusals(stage1, stage2, tmp_path):
    cfg = STAGE2.model_copy(update={"steps": 1, "from_lora": True})
    with pytest.raises(ValueError, match="holds no LoRA weights"):
        finetune(sharp_model(), ByteTokenizer(), cfg, tmp_path / "a", maps=stage1, progress=False, log=lambda s: None)
    with pytest.raises(ValueError, match="rank"):
        finetune(sharp_model(), ByteTokenizer(), cfg.model_copy(update={"lora_rank": 4}), tmp_path / "b", maps=stage2, progress=False, log=lambda s: None)
    with pytest.raises(ValueError, match="must not be the folder it continues from"):
        finetune(sharp_model(), ByteTokenizer(), cfg, stage2, maps=stage2, progress=False, log=lambda s: None)


def test_cli_stage2_through_lola_continues_a_stage2_folder(tmp_path, capsys):
    from lola.cli import main
    from lola.eval.runner import NiahRun, default_lola_config, method_configs

    first = tmp_path / "first"
    assert main(["linearize", "--quick", "--out", str(first)]) == 0
    then = tmp_path / "then"
    cmd = ["linearize", "--quick", "--stage", "2", "--feature-maps", str(first), "--out", str(then), "--stage2-attention", "lola", "--from-lora"]
    assert main([*cmd, "--warmup-steps", "0"]) == 0
    report = json.loads((then / FINETUNE_REPORT_FILE).read_text())
    # the LoLA `lola niah` runs by default on this model, decided in one place
    assert report["config"]["lola"] == default_lola_config("tiny-random-llama").model_dump(mode="json")
    assert default_lola_config("tiny-random-llama") == method_configs(NiahRun(model="tiny-random-llama", methods=["lola"], feature_maps=str(first)))["lola-sre"]
    assert report["config"]["from_lora"] is True and report["config"]["warmup_steps"] == 0
    assert report["student_config"]["mixing"] == "lola_authors"  # the paper's rule, as lola niah runs it
    capsys.readouterr()
    with pytest.raises(SystemExit):  # argparse: one line naming the option
        main(["linearize", "--quick", "--stage", "2", "--out", str(tmp_path / "x"), "--feature-maps", str(first), "--stage2-attention", "sparse"])
    assert "--stage2-attention" in capsys.readouterr().err
    assert main([*cmd[:-1], "--out", str(tmp_path / "y")]) == 2  # without --from-lora a stage-2 folder is refused
    assert "--from-lora" in capsys.readouterr().err


def test_gradient_checkpointing_trains_the_same(stage1, tmp_path):
    cfg = STAGE2.model_copy(update={"steps": 3, "lr": 1e-3, "maps_lr": 1e-3, "lola": THROUGH_LOLA, "eval_chunks": 0})
    plain = finetune(sharp_model(), ByteTokenizer(), cfg, copy_folder(stage1, tmp_path / "plain"), progress=False, log=lambda s: None)
    model = sharp_model()
    recomputed = finetune(
        model,
        ByteTokenizer(),
        cfg.model_copy(update={"gradient_checkpointing": True}),
        copy_folder(stage1, tmp_path / "ckpt"),
        progress=False,
        log=lambda s: None,
    )
    assert model.model.layers[0].gradient_checkpointing  # it really recomputed
    assert recomputed["train_loss"]["every_step"] == pytest.approx(plain["train_loss"]["every_step"], rel=1e-5)
    a, b = read_feature_maps(tmp_path / "plain"), read_feature_maps(tmp_path / "ckpt")
    for k in a.lora:
        torch.testing.assert_close(b.lora[k], a.lora[k], rtol=1e-4, atol=1e-6)
