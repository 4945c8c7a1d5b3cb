import json

import pytest
import torch

import lola
from lola.cli import main
from lola.eval.runner import NiahRun, method_configs, run_niah, summarize
from lola.io.provenance import versions
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


RUN = NiahRun(
    feature_maps=None, lengths=[200], samples=2, policies=["sre", "recency"], window=8, sparse_size=8, sinks=2, chunk=8, max_new_tokens=3, budgets="uniform"
)


def test_methods_share_one_budget():
    cfgs = method_configs(RUN)
    assert list(cfgs) == ["full", "window", "hybrid", "lola-sre", "lola-recency"]
    assert cfgs["full"] is None
    assert {c.exact_budget for c in cfgs.values() if c is not None} == {RUN.budget}
    assert cfgs["window"].mixing == "softmax_only" and cfgs["hybrid"].sparse_size == 0


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
    assert saved["run"] == RUN.model_dump() and set(saved["summary"]) == {"full", "window", "hybrid", "lola-sre", "lola-recency"}
    assert saved["versions"] == versions()  # the release, the commit (a checkout's), torch, transformers, Python
    full_bytes = summarize(records)["full"][200]["cache_bytes"]
    assert all(summarize(records)[m][200]["cache_bytes"] < full_bytes for m in ("window", "hybrid", "lola-sre"))

    # A second call finds every sample done and generates nothing.
    calls = []
    monkeypatch.setattr(model, "generate", lambda *a, **k: calls.append(1))
    again = run_niah(RUN, model, tok, tmp_path, progress=False)
    assert not calls and len(again) == 10
    with pytest.raises(ValueError, match="different run"):
        run_niah(RUN.model_copy(update={"samples": 3}), model, tok, tmp_path, progress=False)


def test_a_run_written_before_the_hybrid_was_renamed_resumes(tmp_path, monkeypatch):
    """Folders from before `lolcats` (the method) was called `hybrid` resume with nothing redone."""
    model, tok = tiny("llama"), TinyTokenizer()
    run = RUN.model_copy(update={"methods": ["full", "hybrid"]})
    run_niah(run, model, tok, tmp_path, progress=False)
    for name in ("samples.jsonl", "results.json"):
        path = tmp_path / name
        path.write_text(path.read_text().replace('"hybrid"', '"lolcats"'))
    (tmp_path / ".lola-files.json").unlink()  # that lola kept no record of what it wrote
    assert '"lolcats"' in (tmp_path / "samples.jsonl").read_text()
    calls = []
    monkeypatch.setattr(model, "generate", lambda *a, **k: calls.append(1))
    again = run_niah(run, model, tok, tmp_path, progress=False)
    assert not calls and sorted({r["method"] for r in again}) == ["full", "hybrid"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--methods", "nope"], "full, window, hybrid, lola"),
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
    run = NiahRun(
        feature_maps=None,
        task=task,
        lengths=[300],
        samples=1,
        methods=["full", "lola"],
        policies=["sre"],
        window=8,
        sparse_size=8,
        sinks=2,
        chunk=8,
        max_new_tokens=2,
        budgets="uniform",
    )
    records = run_niah(run, tiny("llama"), TinyTokenizer(), tmp_path, progress=False)
    assert len(records) == 2 and all(r["answers"] for r in records)


def test_batched_samples_equal_samples_run_alone(tmp_path):
    # Left-padded batches of prompts of different lengths: the same answers as one at a time.
    hay = tmp_path / "prose.txt"  # sentences of varied length: prompts of varied length
    hay.write_text(" ".join("word " * (1 + (i * 7) % 11) + "end." for i in range(200)))
    run = NiahRun(
        feature_maps=None,
        lengths=[200, 260],
        samples=3,
        methods=["full", "window", "lola"],
        policies=["sre", "expected_attention"],
        window=8,
        sparse_size=8,
        sinks=2,
        chunk=8,
        max_new_tokens=4,
        haystack_file=str(hay),
        budgets="uniform",
    )
    model, tok = tiny("llama"), TinyTokenizer()
    alone = run_niah(run, model, tok, tmp_path / "alone", progress=False)
    batched = run_niah(run, model, tok, tmp_path / "batched", progress=False, batch_size=3)
    key = lambda r: (r["method"], r["length"], r["index"])  # noqa: E731
    assert len({r["prompt_tokens"] for r in alone}) > 2  # the batches really are padded
    a, b = {key(r): r for r in alone}, {key(r): r for r in batched}
    assert a.keys() == b.keys()
    for k in a:
        assert a[k]["prediction"] == b[k]["prediction"], k
        if not k[0] == "full":
            assert a[k]["cache_bytes"] == b[k]["cache_bytes"], k
    with pytest.raises(ValueError, match="batch_size"):
        run_niah(run, model, tok, tmp_path / "x", progress=False, batch_size=0)


def test_variants_and_budgets_build_named_methods(tmp_path):
    from lola.budgets import HeadBudgets

    path = tmp_path / "budgets.json"
    HeadBudgets(sparse_size_per_head=[[16, 0], [0, 16]], uniform_sparse_size=8, scores=[[1, 0], [0, 1]], power=1.0).save(path)
    run = NiahRun(
        feature_maps=None,
        lengths=[200],
        samples=1,
        methods=["lola"],
        policies=["sre"],
        window=8,
        sparse_size=8,
        sinks=2,
        chunk=8,
        budgets=str(path),
        variants={"ea-span": {"policy": "span", "policy_kwargs": {"policy": "expected_attention"}}, "uniform-sre": {"policy": "sre", "budgets": "uniform"}},
    )
    cfgs = method_configs(run)
    assert list(cfgs) == ["lola-sre", "lola-ea-span", "lola-uniform-sre"]
    assert cfgs["lola-sre"].for_layer(1).sparse_size_per_head == [0, 16]
    assert cfgs["lola-uniform-sre"].sparse_size_per_head is None and not cfgs["lola-uniform-sre"].layer_overrides
    records = run_niah(run, tiny("llama"), TinyTokenizer(), tmp_path / "o", progress=False)
    by = {r["method"]: r["cache_bytes"] for r in records}
    # The same sparse slots in total (16 a layer), held ragged (no head padded to the largest
    # head's 16): cache_bytes counts what is held, the uniform config's bytes.
    assert by["lola-sre"] == by["lola-uniform-sre"]
    with pytest.raises(ValueError, match="variant 'bad'"):
        NiahRun(variants={"bad": {"window": -1}})
    with pytest.raises(ValueError, match="no shipped budgets"):
        NiahRun(budgets="nope")
    # variants alone: no policy run besides them; neither is an error that names both
    only = method_configs(run.model_copy(update={"policies": []}))
    assert list(only) == ["lola-ea-span", "lola-uniform-sre"]
    with pytest.raises(ValueError, match="policies is empty and there are no variants"):
        NiahRun(methods=["lola"], policies=[])


def test_summary_has_wilson_intervals():
    from lola.eval.runner import wilson_interval

    low, high = wilson_interval(14, 20)
    assert 45 < low < 50 and 85 < high < 88  # 70% of 20: about 48-85%
    assert wilson_interval(0, 20)[0] == 0 and wilson_interval(20, 20)[1] == 100
    recs = [{"method": "m", "length": 1, "score": s, "cache_bytes": 1} for s in (1, 0, 1, 1)]
    row = summarize(recs)["m"][1]
    assert row["low"] < row["accuracy"] == 75.0 < row["high"]


def test_auto_budgets_are_the_models_shipped_ones():
    # The default: calibrated budgets for a model that has them (those of its linearized maps when
    # the run applies them), uniform for any other.
    from lola.pretrained.resolve import maps_budgets

    stock = method_configs(NiahRun(methods=["lola"], policies=["sre"], feature_maps="none"))["lola-sre"]
    assert stock.for_layer(17).sparse_size_per_head == lola.budgets.load("smollm2-135m-instruct").sparse_size_per_head[17]
    linearized = method_configs(NiahRun(methods=["lola"], policies=["sre"]))["lola-sre"]
    assert linearized.for_layer(17).sparse_size_per_head == maps_budgets("smollm2-135m-instruct").sparse_size_per_head[17]
    other = method_configs(NiahRun(model="some/other-model", methods=["lola"]))["lola-sre"]
    assert other.layer_overrides == {} and other.sparse_size == 192
    uniform = method_configs(NiahRun(methods=["lola"], policies=["sre"], budgets="uniform"))["lola-sre"]
    assert uniform.layer_overrides == {}


def test_the_learned_policy_gets_the_models_shipped_scorer(monkeypatch):
    from lola import scorers

    monkeypatch.setitem(scorers.SHIPPED, "some/model", "0" * 64)
    monkeypatch.setitem(scorers.SHIPPED, "some-maps-linearized", "0" * 64)
    monkeypatch.setattr(scorers, "load", lambda name: scorers.TokenScorer(torch.zeros(1, 1, 3)))  # the files do not exist
    run = NiahRun(model="some/model", methods=["lola"], policies=["learned"], budgets="uniform")
    assert method_configs(run)["lola-learned"].policy_kwargs == {"scorer": "some/model"}
    # a variant naming the policy gets the same scorer (unless it names its own kwargs)
    run = NiahRun(model="some/model", methods=["lola"], policies=["sre"], budgets="uniform", variants={"v": {"policy": "learned", "linear_decay": 0.5}})
    variant = method_configs(run)["lola-v"]
    assert variant.policy_kwargs == {"scorer": "some/model"} and variant.linear_decay == 0.5
    # the run's linear-state options reach the lola method and its variants, unless a variant sets its own
    run = run.model_copy(update={"linear_decay": 0.9, "linear_share_cap": 0.1, "mixing": "lola_authors"})
    cfgs = method_configs(run)
    assert (cfgs["lola-sre"].linear_decay, cfgs["lola-sre"].linear_share_cap) == (0.9, 0.1)
    assert (cfgs["lola-v"].linear_decay, cfgs["lola-v"].linear_share_cap) == (0.5, 0.1)
    # with shipped feature maps that have a scorer of their own, that one
    assert scorers.default_scorer("some/model", "some-maps") == "some-maps-linearized"
    assert scorers.default_scorer("some/model", "a-folder") == "some/model"
    with pytest.raises(ValueError, match="no scorer ships for model 'other/model'"):
        method_configs(NiahRun(model="other/model", methods=["lola"], policies=["learned"], budgets="uniform"))


def test_the_default_run_is_the_papers_experiment_on_the_shipped_linearized_model():
    """Where linearized maps ship for the model, `lola niah` with no options runs them: full
    attention, the hybrid and LoLA scored by SRE (the paper's score) and by the learned scorer
    (the tournament's winner, docs/results.md), at 2K and 4K; `--feature-maps none` is the
    training-free run (every method, the learned scorer where one ships, else sre). What was
    decided is recorded in the run."""
    from lola.scorers import available

    assert "smollm2-135m-instruct" in available()
    run = NiahRun()
    assert run.feature_maps == "smollm2-135m-instruct" and run.methods == ["full", "hybrid", "lola"]
    assert run.policies == ["sre", "learned"] and run.lengths == [2048, 4096]
    free = NiahRun(feature_maps="none")
    assert free.feature_maps is None and free.methods == ["full", "window", "hybrid", "lola"] and free.policies == ["learned"]
    assert free.lengths == [1024, 2048]
    assert NiahRun(model="tiny-random-llama").policies == ["sre"] and NiahRun(model="tiny-random-llama").feature_maps is None
    assert NiahRun(policies=["sre"]).policies == ["sre"]
    # the learned scorer with its repeats folded (fold_repeats 0.95, the 8K measurement; four copies kept), named by the policy; SRE as it is
    assert run.fold_repeats == 0.95 and free.fold_repeats == 0.0 and run.fold_copies == 4
    cfg = method_configs(NiahRun(methods=["lola"]))["lola-learned"]
    assert cfg.policy == "distinct"
    assert cfg.policy_kwargs == {"policy": "learned", "policy_kwargs": {"scorer": "smollm2-135m-instruct"}, "threshold": 0.95, "copies": 4}
    assert method_configs(NiahRun(methods=["lola"], fold_copies=1))["lola-learned"].policy_kwargs["copies"] == 1
    sre = method_configs(NiahRun(methods=["lola"]))["lola-sre"]
    assert sre.policy == "sre" and sre.policy_kwargs == {}
    # off: the policy itself; the training-free run's policy is its own
    cfg = method_configs(NiahRun(methods=["lola"], fold_repeats=0))["lola-learned"]
    assert cfg.policy == "learned" and cfg.policy_kwargs == {"scorer": "smollm2-135m-instruct"}
    assert method_configs(NiahRun(methods=["lola"], feature_maps="none"))["lola-learned"].policy == "learned"
    for saved in (run, free):  # a saved run reads back as it ran
        assert NiahRun.model_validate(saved.model_dump()) == saved


def test_past_the_context_full_attention_is_refused_and_bounded_methods_run(tmp_path, capsys):
    model, tok = tiny("llama", max_position_embeddings=128), TinyTokenizer()
    run = RUN.model_copy(update={"methods": ["full", "window", "lola"], "policies": ["sre"], "lengths": [96, 200], "positions": "bounded"})
    records = run_niah(run, model, tok, tmp_path, progress=False)
    summary = summarize(records)
    assert summary["full"][200] == {"refused": "past the model's 128 positions"}
    assert summary["full"][96]["samples"] == 2 and summary["window"][200]["samples"] == 2 and summary["lola-sre"][200]["samples"] == 2
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["summary"]["full"]["200"] == {"refused": "past the model's 128 positions"}
    assert saved["methods"]["lola-sre"]["positions"] == "bounded"
    assert (saved["methods"]["lola-sre"]["exact_distance"], saved["methods"]["lola-sre"]["state_positions"]) == (128 - run.chunk, 128)  # as run
    assert len((tmp_path / "samples.jsonl").read_text().splitlines()) == 2 + 2 * 2 * 2  # refused cells are not samples
    from lola.eval.runner import format_summary

    assert "refused" in format_summary(summary)
    with pytest.raises(ValueError, match="no method bounds its positions: give --positions bounded"):
        run_niah(run.model_copy(update={"positions": None, "lengths": [200]}), model, tok, tmp_path / "absolute", progress=False)
