"""No bad input unanswered: every user error is one clear message naming the argument or file,
given before any expensive work, and no file the command did not write is written over.

Sections: the config, ``compose`` and the layer call, the policy registry, the transformers
integration (bad arguments, unsupported architectures, damaged feature-map folders), and the
``lola`` command (output folders, config files, interrupts). Everything runs on tiny random
models; nothing is downloaded.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

import lola
from lola.cli import main
from lola.config import MAX_TOKENS
from tests.hostile.common import refused, snapshot

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    """Run every test in its own folder: a default output path (``results/…``) lands there."""
    monkeypatch.chdir(tmp_path)


# --------------------------------------------------------------------------------------------
# LoLAConfig
# --------------------------------------------------------------------------------------------

BAD_CONFIGS = [
    ({"window": True}, "window"),
    ({"sinks": False}, "sinks"),
    ({"sparse_size": True}, "sparse_size"),
    ({"chunk": True}, "chunk"),
    ({"feature_dim": True}, "feature_dim"),
    ({"window": "64"}, "window"),
    ({"window": 64.0}, "window"),
    ({"window": -1}, "window"),
    ({"window": 10**12}, "window"),
    ({"sparse_size": MAX_TOKENS + 1}, "sparse_size"),
    ({"sinks": 10**9}, "sinks"),
    ({"chunk": 10**12}, "chunk"),
    ({"feature_dim": 10**9}, "feature_dim"),
    ({"scale": float("inf")}, "scale"),
    ({"scale": float("nan")}, "scale"),
    ({"scale": True}, "scale"),
    ({"window_factor_init": float("nan")}, "window_factor_init"),
    ({"window_factor_init": float("-inf")}, "window_factor_init"),
    ({"window_factor_init": True}, "window_factor_init"),
    ({"affine": 1}, "affine"),
    ({"check_inputs": "yes"}, "check_inputs"),
    ({"window_per_head": [True, 3]}, "window_per_head"),
    ({"sparse_size_per_head": [1.5]}, "sparse_size_per_head"),
    ({"sparse_size_per_head": [10**12]}, "sparse_size_per_head"),
    ({"full_attention_layers": [True]}, "layer indices"),
    ({"layer_overrides": [5]}, r"layer_overrides\[0\] must be a mapping"),
    ({"layer_overrides": {0: 5}}, "layer_overrides"),
    ({"layer_overrides": {0: {"nope": 1}}}, "nope"),
    ({"layer_overrides": {0: {"window": True}}}, r"layer_overrides\[0\]: window"),
    ({"layer_overrides": {1: {"scale": float("nan")}}}, r"layer_overrides\[1\]: scale"),
    ({"layer_overrides": {True: {"window": 3}}}, "layer indices"),
    ({"policy": 5}, "policy"),
    ({"policy_kwargs": {"nope": 1}}, "policy_kwargs"),
]


@pytest.mark.parametrize("kwargs, match", BAD_CONFIGS, ids=[str(k) for k, _ in BAD_CONFIGS])
def test_bad_config_is_refused_naming_the_field(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        lola.LoLAConfig(**kwargs)


def test_config_bounds_and_json_keys_still_accept_sane_values():
    cfg = lola.LoLAConfig(window=MAX_TOKENS, sparse_size=0, chunk=1, scale=1, layer_overrides={"1": {"window": 3}})
    assert cfg.window == MAX_TOKENS and cfg.scale == 1.0 and cfg.for_layer(1).window == 3
    assert lola.LoLAConfig.model_validate_json(cfg.model_dump_json()) == cfg


# --------------------------------------------------------------------------------------------
# compose and the layer call
# --------------------------------------------------------------------------------------------

CFG = lola.LoLAConfig(window=4, sparse_size=4, sinks=0, chunk=4)

BAD_GEOMETRY = [
    ({"num_heads": 2.5, "head_dim": 8}, TypeError, r"num_heads must be an int >= 1, got 2\.5 \(float\)"),
    ({"num_heads": True, "head_dim": 8}, TypeError, r"num_heads .* got True \(bool\)"),
    ({"num_heads": "4", "head_dim": 8}, TypeError, "num_heads"),
    ({"num_heads": 0, "head_dim": 8}, ValueError, "num_heads"),
    ({"num_heads": 4, "head_dim": 8.0}, TypeError, "head_dim"),
    ({"num_heads": 4, "head_dim": 0}, ValueError, "head_dim"),
    ({"num_heads": 4, "head_dim": 8, "num_kv_heads": 3}, ValueError, r"multiple of num_kv_heads \(3\)"),
    ({"num_heads": 4, "head_dim": 8, "num_kv_heads": 2.0}, TypeError, "num_kv_heads"),
    ({"num_heads": 4, "head_dim": 8, "num_kv_heads": 0}, ValueError, "num_kv_heads"),
    ({"num_heads": 4, "head_dim": 8, "layer": -1}, ValueError, "layer"),
    ({"num_heads": 4, "head_dim": 8, "layer": 1.5}, TypeError, "layer"),
]


@pytest.mark.parametrize("kwargs, error, match", BAD_GEOMETRY, ids=[str(k) for k, _, _ in BAD_GEOMETRY])
def test_compose_refuses_bad_geometry(kwargs, error, match):
    with pytest.raises(error, match=match):
        lola.compose(CFG, **kwargs)


def test_compose_refuses_a_dict_config():
    with pytest.raises(TypeError, match="cfg must be a LoLAConfig"):
        lola.compose({"window": 4}, num_heads=2, head_dim=8)


def _qkv(b=1, t=5, h=2, d=8):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(b, t, h, d, generator=g) for _ in range(3))


BAD_CALLS = [
    ("q has 3 dims", lambda q, k, v: (q[0], k, v, {}), ValueError, "q must be"),
    ("k has other heads", lambda q, k, v: (q, k[:, :, :1], v, {}), ValueError, "k must be"),
    ("int tensors", lambda q, k, v: (q.long(), k.long(), v.long(), {}), TypeError, "floating-point"),
    ("mixed dtypes", lambda q, k, v: (q, k.double(), v, {}), TypeError, "share a dtype"),
    ("NaN in v", lambda q, k, v: (q, k, v.index_fill(1, torch.tensor([2]), float("nan")), {}), ValueError, "v contains non-finite"),
    ("mask shape", lambda q, k, v: (q, k, v, {"padding_mask": torch.ones(1, 4, dtype=torch.bool)}), ValueError, "padding_mask"),
    ("mask of 2s", lambda q, k, v: (q, k, v, {"padding_mask": torch.full((1, 5), 2)}), ValueError, "padding_mask"),
    ("state of a wrong type", lambda q, k, v: (q, k, v, {"state": {"seen": 0}}), TypeError, "state must be"),
]


@pytest.mark.parametrize("name, build, error, match", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_layer_call_refuses_bad_tensors(name, build, error, match):
    attn = lola.compose(CFG, num_heads=2, head_dim=8)
    q, k, v, kwargs = build(*_qkv())
    with pytest.raises(error, match=match):
        attn(q, k, v, **kwargs)


# --------------------------------------------------------------------------------------------
# policy registry
# --------------------------------------------------------------------------------------------


class _Scorer:
    needs_attention = False

    def score(self, candidates, ctx):  # pragma: no cover - never called
        return candidates.pos.float()


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: lola.policies.get("nope"), KeyError, "unknown policy 'nope'; available: .*sre"),
        (lambda: lola.policies.get(5), TypeError, "policy name must be a string"),
        (lambda: lola.policies.build("sre", nope=1), TypeError, "nope"),
        (lambda: lola.policies.register("", _Scorer), ValueError, "non-empty string"),
        (lambda: lola.policies.register("broken_policy", object), TypeError, "score"),
        (lambda: lola.policies.register("sre", _Scorer), ValueError, "already registered"),
    ],
    ids=["unknown", "not a string", "bad kwargs", "empty name", "no score", "duplicate"],
)
def test_policy_registry_refuses_bad_names(call, error, match):
    with pytest.raises(error, match=match):
        call()
    assert "broken_policy" not in lola.policies.available()


# --------------------------------------------------------------------------------------------
# transformers integration: arguments and architectures
# --------------------------------------------------------------------------------------------

SMALL = dict(
    vocab_size=101,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    head_dim=8,
)


def tiny_model(model_type: str, **overrides):
    """A tiny random decoder of ``model_type`` built from transformers' classes (no download)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {**SMALL, **overrides}
    if model_type == "opt":
        kwargs = dict(
            vocab_size=101, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256, word_embed_proj_dim=32
        )
    if model_type == "falcon":
        kwargs = dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, **overrides)
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **kwargs)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def shared_llama():
    from lola.models import tiny_random

    return tiny_random()[0]


@pytest.fixture
def llama(shared_llama):
    """The tiny random Llama, left without LoLA after each test even when an assertion fails."""
    yield shared_llama
    if getattr(shared_llama, "_lola", None) is not None:
        from lola.integrations.transformers import remove_lola

        remove_lola(shared_llama)


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

    model = tiny_model(model_type, **overrides)
    with pytest.raises(ValueError, match=match + ".*force=True"):
        apply_lola(model, lola.LoLAConfig())
    assert getattr(model, "_lola", None) is None and model.config._attn_implementation == "eager"


def test_force_applies_lola_to_an_unverified_architecture():
    from lola.integrations.transformers import apply_lola, remove_lola

    model = tiny_model("opt")
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


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"config": {"window": 4}}, TypeError, "config must be a lola.LoLAConfig"),
        ({"config": lola.LoLAConfig(full_attention_layers=[7])}, ValueError, r"full_attention_layers \[7\] out of range"),
        ({"config": lola.LoLAConfig(layer_overrides={9: {"window": 8}})}, ValueError, r"layer_overrides for layers \[9\]"),
        ({"feature_maps": "/nonexistent/maps"}, FileNotFoundError, "does not exist"),
    ],
    ids=["dict config", "full attention layer", "override layer", "missing folder"],
)
def test_apply_lola_refuses_bad_arguments(llama, kwargs, error, match):
    from lola.integrations.transformers import apply_lola

    with pytest.raises(error, match=match):
        apply_lola(llama, **kwargs)
    assert getattr(llama, "_lola", None) is None


def test_apply_lola_twice_is_refused(llama):
    from lola.integrations.transformers import apply_lola, remove_lola

    apply_lola(llama, lola.LoLAConfig())
    try:
        with pytest.raises(ValueError, match="already applied"):
            apply_lola(llama, lola.LoLAConfig())
    finally:
        remove_lola(llama)


# --------------------------------------------------------------------------------------------
# feature-map folders
# --------------------------------------------------------------------------------------------

F = 8  # Hedgehog projection size of the hand-made maps


@pytest.fixture(scope="module")
def maps_folder(tmp_path_factory, shared_llama):
    """A valid feature-map folder for the tiny random Llama (random maps; no training)."""
    from lola.pretrained.folder import model_geometry, write_feature_maps

    geometry = model_geometry(shared_llama)
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(geometry["num_layers"]):
        prefix = f"model.layers.{i}.self_attn."
        for side in ("q", "k"):
            tensors[prefix + f"feature_map_{side}.mlp.layer"] = torch.randn(geometry["num_heads"], geometry["head_dim"], F, generator=g)
        tensors[prefix + "window_factors"] = torch.zeros(1, geometry["num_heads"], 1, 1)
    cfg = lola.LoLAConfig(window=8, sparse_size=0, sinks=0, schedule="tokenwise", feature_map="hedgehog", feature_dim=F, mixing="lolcats")
    folder = tmp_path_factory.mktemp("maps") / "good"
    write_feature_maps(folder, tensors, cfg, geometry)
    return folder


def test_a_valid_folder_applies(maps_folder, llama):
    from lola.integrations.transformers import apply_lola, remove_lola

    apply_lola(llama, lola.LoLAConfig(sparse_size=0), feature_maps=maps_folder)
    assert llama._lola.feature_maps == str(maps_folder)
    remove_lola(llama)


def _edit_tensors(change):
    def edit(folder: Path) -> None:
        from safetensors.torch import load_file, save_file

        path = folder / "feature_maps.safetensors"
        tensors = load_file(str(path))
        change(tensors)
        save_file(tensors, str(path))
        _rehash(folder)

    return edit


def _rehash(folder: Path) -> None:
    """Record the edited files' sums in the description, as a deliberate edit would: the
    content checks must catch what the sums no longer can."""
    import hashlib

    path = folder / "lola_config.json"
    meta = json.loads(path.read_text())
    meta["files"] = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in meta.get("files", {})}
    path.write_text(json.dumps(meta))


def _edit_description(change):
    def edit(folder: Path) -> None:
        path = folder / "lola_config.json"
        meta = json.loads(path.read_text())
        change(meta)
        path.write_text(json.dumps(meta))

    return edit


def _drop_layer(i):
    return lambda t: [t.pop(k) for k in list(t) if f"layers.{i}." in k]


def _cut(name, keep=0.5):
    def edit(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: int(len(data) * keep)])
        if name != "lola_config.json":
            _rehash(folder)

    return edit


def _replace(name, data: bytes):
    def edit(folder: Path) -> None:
        (folder / name).write_bytes(data)
        if name != "lola_config.json":
            _rehash(folder)

    return edit


BAD_FOLDERS = [
    ("layer 1 missing", _edit_tensors(_drop_layer(1)), "feature_maps.safetensors", r"no tensors for layers \[1\]"),
    (
        "extra layer 5",
        _edit_tensors(lambda t: t.update({"model.layers.5.self_attn.window_factors": torch.zeros(1, 4, 1, 1)})),
        "feature_maps.safetensors",
        r"layers \[5\], beyond",
    ),
    ("foreign tensor", _edit_tensors(lambda t: t.update({"foo.bar": torch.zeros(2)})), "feature_maps.safetensors", "'foo.bar'"),
    (
        "window factor missing",
        _edit_tensors(lambda t: t.pop("model.layers.0.self_attn.window_factors")),
        "feature_maps.safetensors",
        r"layer 0 lacks \['window_factors'\]",
    ),
    ("NaN values", _edit_tensors(lambda t: t["model.layers.1.self_attn.window_factors"].fill_(math.nan)), "feature_maps.safetensors", "non-finite"),
    (
        "wrong head count",
        _edit_tensors(lambda t: t.update({"model.layers.0.self_attn.window_factors": torch.zeros(1, 3, 1, 1)})),
        "feature_maps.safetensors",
        "window_factors has 3 values",
    ),
    (
        "wrong head_dim",
        _edit_tensors(lambda t: t.update({"model.layers.0.self_attn.feature_map_q.mlp.layer": torch.zeros(4, 5, F)})),
        "feature_maps.safetensors",
        r"feature_map_q.mlp.layer is \(4, 5, 8\)",
    ),
    ("no geometry", _edit_description(lambda m: m.pop("geometry")), "lola_config.json", "lacks the key 'geometry'"),
    ("no lola_config", _edit_description(lambda m: m.pop("lola_config")), "lola_config.json", "lacks the key 'lola_config'"),
    ("geometry not a mapping", _edit_description(lambda m: m.update(geometry=5)), "lola_config.json", "geometry must be a mapping"),
    ("geometry lacks head_dim", _edit_description(lambda m: m["geometry"].pop("head_dim")), "lola_config.json", "geometry lacks 'head_dim'"),
    ("geometry value a string", _edit_description(lambda m: m["geometry"].update(num_heads="x")), "lola_config.json", "geometry.num_heads must be an int"),
    ("lola_config window a bool", _edit_description(lambda m: m["lola_config"].update(window=True)), "lola_config.json", "lola_config: window"),
    ("lola_config not a mapping", _edit_description(lambda m: m.update(lola_config=[1])), "lola_config.json", "lola_config must be a mapping"),
    ("other version", _edit_description(lambda m: m.update(version=2)), "lola_config.json", "version must be 1"),
    ("bad lora entry", _edit_description(lambda m: m.update(lora={"rank": "x"})), "lola_config.json", "lora: rank"),
    ("foreign description", _replace("lola_config.json", b'{"format": "something-else"}'), "lola_config.json", "not a lola feature-map description"),
    ("truncated description", _cut("lola_config.json"), "lola_config.json", "not valid JSON"),
    ("binary description", _replace("lola_config.json", b"\xff\xfe\x00garbage"), "lola_config.json", "not a text file"),
    ("truncated safetensors", _cut("feature_maps.safetensors"), "feature_maps.safetensors", "not a readable safetensors file"),
    ("garbled safetensors", _replace("feature_maps.safetensors", b"garbage" * 10), "feature_maps.safetensors", "not a readable safetensors file"),
    ("empty safetensors", _replace("feature_maps.safetensors", b""), "feature_maps.safetensors", "not a readable safetensors file"),
]


@pytest.mark.parametrize("name, damage, file, match", BAD_FOLDERS, ids=[c[0] for c in BAD_FOLDERS])
def test_damaged_feature_map_folder_is_refused_naming_file_and_key(name, damage, file, match, maps_folder, llama, tmp_path):
    from lola.integrations.transformers import apply_lola

    folder = tmp_path / "maps"
    shutil.copytree(maps_folder, folder)
    damage(folder)
    before = snapshot(folder)
    with pytest.raises(ValueError, match=re.escape(str(folder / file)) + ".*" + match):
        apply_lola(llama, lola.LoLAConfig(sparse_size=0), feature_maps=folder)
    assert getattr(llama, "_lola", None) is None
    assert snapshot(folder) == before


# --------------------------------------------------------------------------------------------
# the lola command
# --------------------------------------------------------------------------------------------


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a command loads a model: these errors must come before that."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was refused")

    monkeypatch.setattr("lola.models.load", refuse)


NIAH = ["niah", "--model", "tiny-random-llama", "--lengths", "400", "--samples", "2", "--methods", "full", "--max-new-tokens", "1"]


BAD_OPTIONS = [
    (["demo", "--budget", "5"], ["--budget must be an int >= 8"]),
    (["demo", "--budget", "100000", "--length", "256"], ["--budget (100000) must be smaller than --length (256)"]),
    (["demo", "--trials", "0"], ["--trials"]),
    ([*NIAH, "--lengths", "256", "256"], ["--lengths", "distinct", "256 more than once"]),
    ([*NIAH, "--lengths", "100000000"], ["--lengths", f"<= {MAX_TOKENS}"]),
    ([*NIAH, "--methods", "lola", "lola"], ["--methods", "distinct"]),
    ([*NIAH, "--policies", "sre", "sre"], ["--policies", "distinct"]),
    ([*NIAH, "--window", "100000000"], ["--window", "less than or equal to"]),
    ([*NIAH, "--batch-size", "0"], ["--batch-size must be >= 1"]),
    ([*NIAH, "--samples", "0"], ["--samples"]),
    (["perplexity", "--model", "tiny-random-llama", "--lengths", "64", "64"], ["--lengths", "distinct"]),
    (["perplexity", "--model", "tiny-random-llama", "--policy", "nope"], ["unknown policy 'nope'"]),
    (["perplexity", "--model", "tiny-random-llama", "--lengths", "1"], ["--lengths[0]"]),
    (["calibrate", "--model", "tiny-random-llama", "--prompts", "0", "--out", "x.json"], ["--prompts: Input should be greater than or equal to 1"]),
]


def _option_id(argv: list[str]) -> str:
    """``niah --lengths 256 256`` for ``[*NIAH, "--lengths", "256", "256"]``."""
    return " ".join(argv[:1] + argv[len(NIAH) :] if argv[:1] == ["niah"] else argv)


@pytest.mark.parametrize("argv, fragments", BAD_OPTIONS, ids=[_option_id(a) for a, _ in BAD_OPTIONS])
def test_bad_options_are_one_line_before_loading(argv, fragments, capsys, no_model):
    refused(capsys, argv, *fragments)


def test_out_that_is_a_file_or_under_one_is_refused(tmp_path, capsys, no_model):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    refused(capsys, [*NIAH, "--out", str(afile)], f"--out {afile} is a file, not a folder")
    refused(capsys, [*NIAH, "--out", str(afile / "sub")], f"lies under {afile}, which is a file")
    refused(capsys, ["linearize", "--quick", "--out", str(afile)], "is a file, not a folder")
    refused(capsys, ["perplexity", "--model", "tiny-random-llama", "--out", str(tmp_path)], "is a folder; give a file name")
    refused(capsys, ["calibrate", "--model", "tiny-random-llama", "--out", str(tmp_path)], "is a folder; give a file name")
    assert afile.read_text() == "mine"


@pytest.mark.skipif(not Path("/sys").is_dir(), reason="no /sys")
def test_out_in_an_unwritable_place_is_refused(capsys, no_model):
    try:
        os.rmdir(tempfile.mkdtemp(dir="/sys"))
        pytest.skip("/sys is writable here")
    except OSError:
        pass
    refused(capsys, [*NIAH, "--out", "/sys/lola-results"], "--out /sys/lola-results: cannot write in /sys")
    refused(capsys, ["perplexity", "--model", "tiny-random-llama", "--out", "/sys/lola/ppl.json"], "cannot write in /sys")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only folders")
def test_out_in_a_read_only_folder_is_refused(tmp_path, capsys, no_model):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        refused(capsys, [*NIAH, "--out", str(locked / "run")], "cannot write in")
    finally:
        locked.chmod(0o700)


def _lola_results() -> dict:
    """The start of the results.json that ``lola niah NIAH`` writes (its run and format marker)."""
    from lola.eval.runner import RESULTS_FORMAT, NiahRun

    run = NiahRun(model="tiny-random-llama", lengths=[400], samples=2, methods=["full"], max_new_tokens=1)
    return {"format": RESULTS_FORMAT, "run": run.model_dump(), "summary": {}}


SAMPLE = {"method": "full", "length": 400, "index": 0, "depth": 0.25, "score": 1.0, "cache_bytes": 10, "tokens_per_second": 1.0}
RESULTS = json.dumps(_lola_results()).encode()


def _results_with(**run_changes) -> bytes:
    """A lola results.json whose run differs from NIAH's by ``run_changes``."""
    data = _lola_results()
    return json.dumps({**data, "run": {**data["run"], **run_changes}}).encode()


FOREIGN_FOLDERS = [
    ("another tool's results.json", {"results.json": b'{"accuracy": 0.5}\n'}, ["results.json was not written by lola niah", "lola-niah-results"]),
    ("a list as results.json", {"results.json": b"[1, 2]"}, ["was not written by lola niah"]),
    ("truncated results.json", {"results.json": RESULTS[:40]}, ["results.json is not a lola niah results file: invalid JSON"]),
    ("binary results.json", {"results.json": b"\x89PNG\r\n"}, ["results.json is not a lola niah results file: not UTF-8"]),
    ("a plot without results", {"accuracy.png": b"\x89PNG..."}, ["holds accuracy.png but no lola results.json"]),
    ("samples without results", {"samples.jsonl": b"{}\n"}, ["holds samples.jsonl but no lola results.json"]),
    (
        "truncated samples.jsonl",
        {"results.json": RESULTS, "samples.jsonl": (json.dumps(SAMPLE) + "\n" + json.dumps(SAMPLE)[:30]).encode()},
        ["samples.jsonl: line 2 is not a complete JSON record", "delete that line"],
    ),
    ("foreign samples.jsonl line", {"results.json": RESULTS, "samples.jsonl": b'{"id": 3}\n'}, ["samples.jsonl: line 1 is not a lola niah sample"]),
    ("a different run", {"results.json": _results_with(samples=3)}, ["holds a different run"]),
    ("a run this version refuses", {"results.json": _results_with(window=True)}, ["holds a run this version of lola refuses", "window"]),
]


@pytest.mark.parametrize("name, files, fragments", FOREIGN_FOLDERS, ids=[c[0] for c in FOREIGN_FOLDERS])
def test_niah_out_with_foreign_or_damaged_files_is_refused_and_left_intact(name, files, fragments, tmp_path, capsys, no_model):
    out = tmp_path / "out"
    out.mkdir()
    for file, data in files.items():
        (out / file).write_bytes(data)
    before = snapshot(out)
    refused(capsys, [*NIAH, "--out", str(out)], *fragments)
    assert snapshot(out) == before


def test_perplexity_and_calibrate_leave_foreign_files_alone(tmp_path, capsys, no_model):
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"mine": true}\n')
    refused(capsys, ["perplexity", "--model", "tiny-random-llama", "--out", str(foreign)], "was not written by lola perplexity")
    refused(capsys, ["calibrate", "--model", "tiny-random-llama", "--out", str(foreign)], "was not written by lola calibrate")
    assert foreign.read_text() == '{"mine": true}\n'


@pytest.mark.parametrize(
    "name, text, fragments",
    [
        ("bad.yaml", "lengths: [400\nsamples: 2\n", ["--config", "bad.yaml is not valid YAML", "line 2"]),
        ("bad.json", '{"lengths": [400,', ["--config", "bad.json is not valid JSON"]),
        ("list.yaml", "- 1\n- 2\n", ["must hold a mapping of options, got list"]),
        ("keys.yaml", "1: 2\n", ["option names must be strings"]),
        ("typo.yaml", "windw: 3\n", ["unknown option 'windw'"]),
        ("bool.yaml", "window: true\n", ["--window", "valid integer"]),
        ("batch.yaml", "batch_size: two\n", ["--batch-size must be an int"]),
        ("binary.json", b"\xff\xfe{}", ["binary.json is not a text file"]),
    ],
)
def test_malformed_config_file_is_one_line_naming_it(name, text, fragments, tmp_path, capsys, no_model):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = path.read_bytes()
    refused(capsys, [*NIAH, "--config", str(path), "--out", str(tmp_path / "o")], *fragments)
    assert path.read_bytes() == before and not (tmp_path / "o").exists()


def test_missing_config_file(tmp_path, capsys, no_model):
    refused(capsys, [*NIAH, "--config", str(tmp_path / "nope.yaml")], "nope.yaml", "No such file")


@pytest.mark.parametrize("command", [["perplexity", "--model", "tiny-random-llama"], NIAH], ids=["perplexity", "niah"])
def test_a_damaged_feature_map_folder_is_refused_before_loading(command, maps_folder, tmp_path, capsys, no_model):
    folder = tmp_path / "maps"
    shutil.copytree(maps_folder, folder)
    _edit_tensors(_drop_layer(0))(folder)
    refused(capsys, [*command, "--feature-maps", str(folder)], f"{folder / 'feature_maps.safetensors'} has no tensors for layers [0]")
    assert [p.name for p in tmp_path.iterdir()] == ["maps"]  # no results folder was started


def test_linearize_refuses_foreign_description_and_damaged_checkpoint(tmp_path, capsys, no_model):
    out = tmp_path / "run"
    out.mkdir()
    (out / "lola_config.json").write_text('{"model": "someone else\'s"}')
    before = snapshot(out)
    refused(capsys, ["linearize", "--quick", "--stage", "1", "--out", str(out)], "lola_config.json was not written by lola linearize")
    assert snapshot(out) == before
    (out / "lola_config.json").unlink()
    (out / "checkpoint.pt").write_bytes(b"PK\x03\x04 cut short")
    before = snapshot(out)
    refused(capsys, ["linearize", "--quick", "--stage", "1", "--out", str(out)], "checkpoint.pt is not a readable checkpoint")
    assert snapshot(out) == before


def test_linearize_stage_2_needs_stage_1_maps(tmp_path, capsys, no_model):
    refused(capsys, ["linearize", "--quick", "--stage", "2", "--out", str(tmp_path / "empty")], "stage 2 starts from stage-1 feature maps")


# --- after loading, before generating ------------------------------------------------------


@pytest.fixture
def scripted_model(monkeypatch):
    """``lola.models.load`` gives the tiny random Llama; ``script`` decides what each
    generate() call does (``None``: generate; an exception: raise it; a function: call it)."""
    from lola.models import tiny_random

    script: list = []
    calls: list = []

    def load(name, **kwargs):
        model, tok = tiny_random()
        generate = model.generate

        def scripted(*args, **kw):
            calls.append(1)
            action = script.pop(0) if script else None
            if isinstance(action, BaseException):
                raise action
            if action is not None:
                action()
            return generate(*args, **kw)

        model.generate = scripted
        return model, tok

    monkeypatch.setattr("lola.models.load", load)
    return script, calls


def test_length_beyond_the_models_positions_is_refused_before_generating(tmp_path, capsys, scripted_model):
    _, calls = scripted_model
    out = tmp_path / "o"
    refused(capsys, [*NIAH, "--lengths", "100000", "--out", str(out)], "length 100000 exceeds what the model can hold (8192 positions)")
    assert not calls and not out.exists()


def test_ctrl_c_keeps_partial_results_and_resumes(tmp_path, capsys, scripted_model):
    script, calls = scripted_model
    out = tmp_path / "o"
    script.extend([None, KeyboardInterrupt()])  # the second sample is interrupted
    assert main([*NIAH, "--out", str(out)]) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"lola niah: interrupted; finished samples are kept in {out / 'samples.jsonl'}; run the same command again to resume"
    assert len((out / "samples.jsonl").read_text().splitlines()) == 1
    assert json.loads((out / "results.json").read_text())["summary"]["full"]["400"]["samples"] == 1

    # While a resume runs, and after it fails, results.json still summarises the saved sample
    # (it used to be rewritten with an empty summary first).
    def fail_after_looking():
        seen.append(json.loads((out / "results.json").read_text())["summary"])
        raise ValueError("generation failed")

    seen: list = []
    script.append(fail_after_looking)
    assert main([*NIAH, "--out", str(out)]) == 2
    assert "lola niah: error: generation failed" in capsys.readouterr().err
    assert seen[0]["full"]["400"]["samples"] == 1
    assert json.loads((out / "results.json").read_text())["summary"]["full"]["400"]["samples"] == 1

    assert main([*NIAH, "--out", str(out)]) == 0  # the same command resumes and finishes
    assert len((out / "samples.jsonl").read_text().splitlines()) == 2 and len(calls) == 4


# --- debugging ------------------------------------------------------------------------------


def test_debug_flag_and_environment_show_the_traceback(monkeypatch, capsys):
    with pytest.raises(ValueError, match="--budget"):
        main(["demo", "--budget", "5", "--debug"])
    monkeypatch.setenv("LOLA_DEBUG", "1")
    with pytest.raises(ValueError, match="--budget"):
        main(["demo", "--budget", "5"])
    monkeypatch.setenv("LOLA_DEBUG", "0")
    refused(capsys, ["demo", "--budget", "5"], "--budget")


def test_real_bugs_are_not_swallowed(monkeypatch):
    def broken(**kwargs):
        raise AttributeError("a bug, not bad input")

    monkeypatch.setattr("lola.eval.demo.run_demo", broken)
    with pytest.raises(AttributeError, match="a bug"):
        main(["demo", "--length", "64", "--budget", "16"])


# --------------------------------------------------------------------------------------------
# files read through the API
# --------------------------------------------------------------------------------------------


def test_truncated_budgets_file_names_it(tmp_path):
    path = tmp_path / "budgets.json"
    path.write_text('{"sparse_size_per_head": [[1, 2')
    with pytest.raises(ValueError, match=re.escape(str(path)) + " is not a valid budgets file"):
        lola.budgets.load(path)


def test_truncated_checkpoint_names_it(tmp_path):
    from lola.linearize import LinearizeConfig
    from lola.linearize.checkpoint import checksum_path, read_checkpoint, write_checkpoint

    cfg = LinearizeConfig(steps=4)
    path = tmp_path / "checkpoint.pt"
    write_checkpoint(path, {"config": cfg.model_dump(), "step": 2})
    read_checkpoint(path, cfg, {}, "--steps")  # readable as written
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(ValueError, match=re.escape(str(path)) + " does not match its checksum in checkpoint.pt.sha256"):
        read_checkpoint(path, cfg, {}, "--steps")
    checksum_path(path).unlink()  # a checkpoint without its checksum: still read with care
    with pytest.raises(ValueError, match=re.escape(str(path)) + " is not a readable checkpoint"):
        read_checkpoint(path, cfg, {}, "--steps")
