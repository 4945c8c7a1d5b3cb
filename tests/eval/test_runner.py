import json

import pytest
import torch

from lola.cli import main
from lola.eval.runner import NiahRun, method_configs, run_niah, summarize
from tests.integrations.transformers.conftest import tiny


class TinyTokenizer:
    """Words to ids in [3, 101); decode writes ids back as numbers. No chat template."""

    chat_template = None
    eos_token_id = 0

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        ids = torch.tensor([[3 + sum(map(ord, w)) % 98 for w in text.split()]])
        return type("Enc", (), {"input_ids": ids})()

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(int(i)) for i in ids)


RUN = NiahRun(lengths=[200], samples=2, policies=["sre", "recency"], window=8, sparse_size=8, sinks=2, chunk=8, max_new_tokens=3)


def test_methods_share_one_budget():
    cfgs = method_configs(RUN)
    assert list(cfgs) == ["full", "window", "lolcats", "lola-sre", "lola-recency"]
    assert cfgs["full"] is None
    assert {c.exact_budget for c in cfgs.values() if c is not None} == {RUN.budget}
    assert cfgs["window"].mixing == "softmax_only" and cfgs["lolcats"].sparse_size == 0


def test_run_records_every_sample_and_resumes(tmp_path, monkeypatch):
    model, tok = tiny("llama"), TinyTokenizer()
    records = run_niah(RUN, model, tok, tmp_path, progress=False)
    assert len(records) == 5 * 2
    assert not hasattr(model, "_lola")  # LoLA removed after each method
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 10
    rec = json.loads(lines[-1])
    assert {"method", "length", "index", "depth", "prompt_tokens", "answers", "prediction", "score", "cache_bytes", "seconds"} <= rec.keys()
    assert rec["prompt_tokens"] <= 200 - RUN.max_new_tokens
    assert (tmp_path / "accuracy.png").stat().st_size > 1000 and (tmp_path / "cache_bytes.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["summary_by_depth"]["full"]) == {"0.2-0.4", "0.6-0.8"}  # depths 0.25 and 0.75
    assert saved["run"] == RUN.model_dump() and set(saved["summary"]) == {"full", "window", "lolcats", "lola-sre", "lola-recency"}
    assert saved["versions"]["lola"]
    full_bytes = summarize(records)["full"][200]["cache_bytes"]
    assert all(summarize(records)[m][200]["cache_bytes"] < full_bytes for m in ("window", "lolcats", "lola-sre"))

    # A second call finds every sample done and generates nothing.
    calls = []
    monkeypatch.setattr(model, "generate", lambda *a, **k: calls.append(1))
    again = run_niah(RUN, model, tok, tmp_path, progress=False)
    assert not calls and len(again) == 10
    with pytest.raises(ValueError, match="different run"):
        run_niah(RUN.model_copy(update={"samples": 3}), model, tok, tmp_path, progress=False)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--methods", "nope"], "full, window, lolcats, lola"),
        (["--task", "nope"], "niah_single_1, niah_multikey_2, niah_multikey_3, vt"),
        (["--haystack-file", "/nonexistent/prose.txt"], "does not exist"),
        (["--needle", "code {key}", "--question", "what is {key}?"], "{value}"),
        (["--needle", "code {key} {value}"], "together"),
        (["--config", "/nonexistent/run.yaml"], "No such file"),
        (["--policies", "nope"], "sre"),
        (["--lengths", "10"], ">= 64"),
        (["--samples", "0"], "--samples"),
    ],
)
def test_bad_input_is_a_message_not_a_traceback(argv, message, capsys):
    assert main(["niah", *argv]) == 2
    assert message in capsys.readouterr().err


def test_empty_haystack_file_is_refused(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    assert main(["niah", "--haystack-file", str(empty)]) == 2
    assert "is empty" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_config_file_with_command_line_override(tmp_path, fmt, monkeypatch):
    import lola.eval.runner as runner

    path = tmp_path / f"run.{fmt}"
    path.write_text('{"samples": 3, "lengths": [512], "policies": ["recency"]}' if fmt == "json" else "samples: 3\nlengths: [512]\npolicies: [recency]\n")
    seen = {}
    monkeypatch.setattr("lola.models.load", lambda name: (None, None))
    monkeypatch.setattr(runner, "run_niah", lambda run, model, tok, out, **kw: seen.setdefault("run", run) and [])
    assert main(["niah", "--config", str(path), "--samples", "2", "--out", str(tmp_path / "o")]) == 0
    assert seen["run"].samples == 2 and seen["run"].lengths == [512] and seen["run"].policies == ["recency"]


@pytest.mark.parametrize("task", ["niah_multikey_2", "niah_multikey_3", "vt"])
def test_other_tasks_run_end_to_end(tmp_path, task):
    run = NiahRun(task=task, lengths=[300], samples=1, methods=["full", "lola"], window=8, sparse_size=8, sinks=2, chunk=8, max_new_tokens=2)
    records = run_niah(run, tiny("llama"), TinyTokenizer(), tmp_path, progress=False)
    assert len(records) == 2 and all(r["answers"] for r in records)
