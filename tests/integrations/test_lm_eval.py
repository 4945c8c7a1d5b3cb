"""lm-evaluation-harness integration: the ``lola`` model and the exported niah task, offline.

Everything runs on tiny random Llamas (``tiny-random-llama`` and the same weights saved as a
Hugging Face folder with a byte tokenizer) through lm-eval's ``simple_evaluate``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import lm_eval  # in the dev extra: these tests run wherever the README's set-up ran
import pytest

import lola
from lola.data.text import ByteTokenizer
from lola.eval.runner import NiahRun, method_configs, run_niah
from lola.integrations.lm_eval.__main__ import main as cli_main
from lola.integrations.lm_eval.model import LoLALM, byte_tokenizer, lola_config_from_args
from lola.integrations.lm_eval.niah import export_niah, exported_files

LENGTH = 512  # the niah template alone is ~300 bytes
FULL = {"window": 1024, "sparse_size": 0, "sinks": 0}  # covers every prompt: LoLA == full attention
SMALL = {"window": 16, "sparse_size": 16, "sinks": 4, "chunk": 16}


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No Hub access, and a private datasets cache."""
    import datasets
    import huggingface_hub

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """``tiny-random-llama``'s weights and a byte tokenizer as a Hugging Face folder."""
    folder = tmp_path_factory.mktemp("tiny-hf")
    model, _ = lola.models.tiny_random()
    model.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def niah_run(tmp_path_factory):
    """``lola niah`` on tiny-random-llama (full and lola), the prompts it built, and the same
    prompts exported as an lm-eval task."""
    run = NiahRun(model="tiny-random-llama", lengths=[LENGTH], samples=3, methods=["full", "lola"], **SMALL)
    built = []
    from lola.eval import niah

    real = niah.make_sample

    def spy(*args, **kwargs):
        built.append(real(*args, **kwargs))
        return built[-1]

    model, tok = lola.models.load("tiny-random-llama")
    mp = pytest.MonkeyPatch()
    mp.setattr(niah, "make_sample", spy)
    try:
        records = run_niah(run, model, tok, tmp_path_factory.mktemp("niah-out"), progress=False)
    finally:
        mp.undo()
    tasks = tmp_path_factory.mktemp("niah-task")
    yaml_path = export_niah(tasks, ByteTokenizer(), task=run.task, lengths=run.lengths, samples=run.samples, seed=run.seed)
    rows = [json.loads(line) for line in exported_files(yaml_path)[0].read_text().splitlines()]
    return run, records, built, tasks, rows


def evaluate(lm, task: str, include_path: Path, batch_size: int = 1) -> dict:
    from lm_eval.tasks import TaskManager

    lm.batch_size_per_gpu = batch_size
    manager = TaskManager(include_path=str(include_path), include_defaults=False)
    return lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=manager, log_samples=True, batch_size=batch_size, verbosity="ERROR")


def responses(results: dict, task: str) -> list:
    """Each document's filtered responses (a generated text, or a (loglikelihood, greedy) per choice)."""
    out = [s["filtered_resps"] for s in sorted(results["samples"][task], key=lambda s: s["doc_id"])]
    return [r[0] if len(r) == 1 and isinstance(r[0], str) else r for r in out]


# ---- the exported niah task ---------------------------------------------------------------


def test_export_writes_the_prompts_lola_niah_builds(niah_run, hf_folder) -> None:
    run, _, built, tasks, rows = niah_run
    assert len(built) == len(rows) == run.samples
    assert [r["text"] for r in rows] == [s.text for s in built]
    assert [r["answers"] for r in rows] == [s.answers for s in built]
    assert [r["depth"] for r in rows] == [s.depth for s in built]
    # lm-eval tokenizes each exported text back to exactly the ids lola niah generated from
    lm = LoLALM(pretrained=str(hf_folder), device="cpu", apply_lola=False)
    for row, sample in zip(rows, built):
        ids, _ = lm.tok_batch_encode([row["text"]])
        assert ids[0].tolist() == sample.input_ids[0].tolist() == lm.tok_encode(row["text"])
        assert row["prompt_tokens"] == sample.length <= LENGTH - run.new_tokens
    text = (tasks / "lola_niah_single_1.yaml").read_text()
    assert "output_type: generate_until" in text and "dataset_path: json" in text and f"max_gen_toks: {run.new_tokens}" in text


def test_exported_chat_prompts_tokenize_back(tmp_path) -> None:
    tok = byte_tokenizer()
    tok.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    path = export_niah(tmp_path, tok, task="vt", lengths=[LENGTH], samples=2, name="my_vt")
    data, utils = exported_files(path)
    assert path.name == "my_vt.yaml" and utils.is_file() and utils.name.startswith("my_vt_utils_")
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    from lola.eval.niah import make_sample

    lm = LoLALM(pretrained="tiny-random-llama", tokenizer=tok, device="cpu", apply_lola=False)
    for i, row in enumerate(rows):
        sample = make_sample(tok, "vt", LENGTH, (i + 0.5) / 2, seed=i, max_new_tokens=64)
        assert row["text"] == sample.text and row["text"].startswith("<|user|>") and row["answers"] == sample.answers
        assert lm.tok_batch_encode([row["text"]])[0][0].tolist() == sample.input_ids[0].tolist()


def test_niah_task_through_lm_eval_matches_lola_niah(niah_run) -> None:
    run, records, _, tasks, rows = niah_run
    by_method = {m: [r for r in sorted(records, key=lambda r: r["index"]) if r["method"] == m] for m in ("full", "lola-sre")}
    stock = evaluate(LoLALM(pretrained="tiny-random-llama", device="cpu", apply_lola=False), "lola_niah_single_1", tasks)
    cfg = method_configs(run)["lola-sre"]
    lm = LoLALM(pretrained="tiny-random-llama", device="cpu", lola_config=cfg.model_dump(exclude_unset=True))
    assert lm.lola_config == cfg
    patched = evaluate(lm, "lola_niah_single_1", tasks)
    # lm-eval sent the exported text as is (no chat template, no delimiter) ...
    prompts = [s["arguments"][0][0] for s in sorted(stock["samples"]["lola_niah_single_1"], key=lambda s: s["doc_id"])]
    assert prompts == [r["text"] for r in rows]
    # ... and got lola niah's predictions and scores, for stock attention and for LoLA
    for results, method in ((stock, "full"), (patched, "lola-sre")):
        assert responses(results, "lola_niah_single_1") == [r["prediction"] for r in by_method[method]]
        scores = [s["string_match_all"] for s in sorted(results["samples"]["lola_niah_single_1"], key=lambda s: s["doc_id"])]
        assert scores == [r["score"] for r in by_method[method]]
        summary = results["results"]["lola_niah_single_1"]
        assert summary["string_match_all,none"] == summary[f"string_match_all_{LENGTH},none"] == sum(scores) / len(scores)
    assert patched["config"]["lola_config"] == cfg.model_dump(mode="json")


def test_generate_until_full_budget_equals_stock_and_batches(niah_run, hf_folder) -> None:
    from lm_eval.models.huggingface import HFLM

    tasks = niah_run[3]
    stock = responses(evaluate(HFLM(pretrained=str(hf_folder), device="cpu"), "lola_niah_single_1", tasks, batch_size=3), "lola_niah_single_1")
    full = responses(evaluate(LoLALM(pretrained=str(hf_folder), device="cpu", **FULL), "lola_niah_single_1", tasks, batch_size=3), "lola_niah_single_1")
    assert full == stock
    small = LoLALM(pretrained=str(hf_folder), device="cpu", **SMALL)
    batched = responses(evaluate(small, "lola_niah_single_1", tasks, batch_size=3), "lola_niah_single_1")
    alone = responses(evaluate(small, "lola_niah_single_1", tasks, batch_size=1), "lola_niah_single_1")
    assert batched == alone  # left-padded batches: each row as alone
    assert batched != stock and all(isinstance(s, str) and s for s in batched)


# ---- a loglikelihood task -----------------------------------------------------------------


@pytest.fixture(scope="module")
def mc_task(tmp_path_factory) -> Path:
    """A tiny local multiple-choice task whose contexts are longer than the small budget."""
    folder = tmp_path_factory.mktemp("mc-task")
    filler = "The grass is green. The sky is blue. The sun is yellow. "
    docs = [
        {"question": filler * (2 + i % 3) + f"Question {i}: which colour is the sky?\nAnswer:", "choices": [" blue", " green", " red and yellow"], "label": 0}
        for i in range(6)
    ]
    (folder / "tiny_mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "tiny_mc.yaml").write_text(
        "task: tiny_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {json.dumps(str(folder / 'tiny_mc.jsonl'))}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: question\ndoc_to_choice: choices\n"
        "doc_to_target: label\nmetric_list:\n  - metric: acc\nmetadata:\n  version: 1.0\n"
    )
    return folder


def loglikelihoods(results: dict) -> list[float]:
    return [ll for resps in responses(results, "tiny_mc") for ll, _ in resps]


def test_loglikelihood_full_budget_equals_stock(hf_folder, mc_task) -> None:
    from lm_eval.models.huggingface import HFLM

    stock = loglikelihoods(evaluate(HFLM(pretrained=str(hf_folder), device="cpu"), "tiny_mc", mc_task, batch_size=4))
    full = LoLALM(pretrained=str(hf_folder), device="cpu", **FULL)
    assert full.model._lola is not None
    assert loglikelihoods(evaluate(full, "tiny_mc", mc_task, batch_size=4)) == pytest.approx(stock, abs=1e-5)
    small = LoLALM(pretrained=str(hf_folder), device="cpu", **SMALL)
    batched = loglikelihoods(evaluate(small, "tiny_mc", mc_task, batch_size=4))
    alone = loglikelihoods(evaluate(small, "tiny_mc", mc_task, batch_size=1))
    assert batched == pytest.approx(alone, abs=1e-5)  # right-padded batches score as alone
    assert all(math.isfinite(x) and x < 0 for x in batched)
    assert max(abs(a - b) for a, b in zip(batched, stock)) > 1e-3  # the small budget changes the scores
    # the registered name loads the same weights
    named = LoLALM(pretrained="tiny-random-llama", device="cpu", **FULL)
    assert loglikelihoods(evaluate(named, "tiny_mc", mc_task, batch_size=4)) == pytest.approx(stock, abs=1e-5)


# ---- model_args ---------------------------------------------------------------------------


def test_lola_config_from_model_args(tmp_path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text("window: 32\nsparse_size: 48\nlayer_overrides: {0: {window: 64}}\nbudgets: uniform\n")
    cfg, maps = lola_config_from_args(str(path), sparse_size=16, full_attention_layers="[1]")
    assert (cfg.window, cfg.sparse_size, cfg.full_attention_layers, cfg.layer_overrides) == (32, 16, [1], {0: {"window": 64}})
    assert maps is None
    assert lola_config_from_args(None)[0] == lola.LoLAConfig()
    # "auto" budgets: the shipped ones for a registered model that has them, else uniform
    auto, _ = lola_config_from_args(None, model_name="smollm2-135m-instruct", sparse_size=64)
    assert auto == lola.budgets.load("smollm2-135m-instruct").apply(lola.LoLAConfig(sparse_size=64))
    assert lola_config_from_args(None, model_name="tiny-random-llama")[0].layer_overrides == {}
    with pytest.raises(ValueError, match="unknown model_args"):
        lola_config_from_args(None, windoww=3)
    with pytest.raises(ValueError, match="stock model"):
        LoLALM(pretrained="tiny-random-llama", device="cpu", apply_lola=False, window=3)


def test_cli_export_and_run(tmp_path, capsys) -> None:
    tasks = tmp_path / "tasks"
    assert (
        cli_main(["export-niah", "--out", str(tasks), "--model", "tiny-random-llama", "--lengths", str(LENGTH), "--samples", "1", "--max-new-tokens", "4"]) == 0
    )
    assert "lola_niah_single_1" in capsys.readouterr().out
    assert cli_main(["export-niah", "--out", str(tasks), "--model", "tiny-random-llama", "--lengths", "32"]) == 2
    out = tmp_path / "results"
    assert (
        cli_main(
            [
                "run",
                "--model_args",
                "pretrained=tiny-random-llama,window=32,sparse_size=32",
                "--tasks",
                "lola_niah_single_1",
                "--include_path",
                str(tasks),
                "--device",
                "cpu",
                "--output_path",
                str(out),
            ]
        )
        == 0
    )
    saved = json.loads(next(out.rglob("results_*.json")).read_text())
    assert saved["config"]["model"] == "lola" and saved["config"]["lola_config"]["window"] == 32
    assert saved["results"]["lola_niah_single_1"]["string_match_all,none"] in (0.0, 1.0)
