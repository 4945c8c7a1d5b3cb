"""Hostile inputs, class ``files``: a file lola reads that is damaged, foreign, of the wrong kind
or in the wrong place is refused naming the file (and the key or tensor at fault), and the file
is left as it was.

Feature-map folders (through ``apply_lola`` and the commands, before any model loads), saved
LoLA models (``from_pretrained``), budgets files, token scorers, checkpoints, and inputs that are
not regular files (a FIFO would block).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import lola
from tests.hostile.common import (
    FULL_NIAH,
    GOOD_BUDGETS,
    WINDOW_NIAH,
    Case,
    cut,
    dangling_link,
    edit_safetensors,
    layer,
    make_file,
    make_folder,
    params,
    qkv,
    refused,
    rehash_maps,
    snapshot,
    tiny_lola,
    write_random_maps,
)

transformers = pytest.importorskip("transformers")


# -- feature-map folders ---------------------------------------------------------------------------


F = 8  # Hedgehog projection size of the hand-made maps


@pytest.fixture(scope="module")
def maps_folder(tmp_path_factory):
    """A valid feature-map folder for the tiny random Llama (random maps; no training)."""
    return write_random_maps(tmp_path_factory.mktemp("maps") / "good", f=F)


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
        rehash_maps(folder)

    return edit


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
            rehash_maps(folder)

    return edit


def _replace(name, data: bytes):
    def edit(folder: Path) -> None:
        (folder / name).write_bytes(data)
        if name != "lola_config.json":
            rehash_maps(folder)

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


@pytest.mark.parametrize("command", [["perplexity", "--model", "tiny-random-llama"], [*FULL_NIAH[:-3], "hybrid", *FULL_NIAH[-2:]]], ids=["perplexity", "niah"])
def test_a_damaged_feature_map_folder_is_refused_before_loading(command, maps_folder, tmp_path, capsys, no_model):
    folder = tmp_path / "maps"
    shutil.copytree(maps_folder, folder)
    _edit_tensors(_drop_layer(0))(folder)
    refused(capsys, [*command, "--feature-maps", str(folder)], f"{folder / 'feature_maps.safetensors'} has no tensors for layers [0]")
    assert [p.name for p in tmp_path.iterdir()] == ["maps"]  # no results folder was started


# -- option files, haystacks, budgets and checkpoints ----------------------------------------------


@pytest.mark.parametrize("option", ["--config", "--haystack-file"])
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_inputs_that_are_not_regular_files_are_refused_without_blocking(option, kind, tmp_path, capsys, no_model):
    path = tmp_path / ("in.json" if option == "--config" else "hay.txt")
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    refused(capsys, [*WINDOW_NIAH, option, str(path), "--out", str(tmp_path / "r")], path.name)


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


# -- saved LoLA models and the feature maps apply_lola is given ------------------------------------


def saved_model(folder: Path, cfg: lola.LoLAConfig | None = None) -> Path:
    """A tiny LoLA model saved with ``save_pretrained`` (trainable Hedgehog maps: LoLA weights)."""
    model = tiny_lola(cfg or lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, feature_map="hedgehog", feature_dim=8))
    model.save_pretrained(folder)
    return folder


def edit_model_config(folder: Path, change: Callable[[dict], None]) -> None:
    data = json.loads((folder / "config.json").read_text())
    change(data)
    (folder / "config.json").write_text(json.dumps(data))


def edit_model_tensors(folder: Path, change: Callable[[dict], None]) -> None:
    from safetensors.torch import load_file, save_file

    (path,) = folder.glob("*.safetensors")
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def lola_weight(tensors: dict) -> str:
    """The name of a LoLA weight among a saved model's tensors."""
    return sorted(k for k in tensors if ".lola." in k and tensors[k].is_floating_point())[0]


def _apply(model=None, **kwargs):
    def run(tmp_path):
        from lola.integrations.transformers import apply_lola
        from lola.models import tiny_random

        apply_lola(model if model is not None else tiny_random()[0], kwargs.pop("config", lola.LoLAConfig()), **kwargs)

    return run


def _apply_maps(make):
    def run(tmp_path):
        from lola.integrations.transformers import apply_lola
        from lola.models import tiny_random

        apply_lola(tiny_random()[0], lola.LoLAConfig(), feature_maps=make(tmp_path))

    return run


def _from_pretrained(prepare):
    def run(tmp_path):
        from lola.integrations.transformers import from_pretrained

        from_pretrained(prepare(tmp_path))

    return run


def _edited(make, edit):
    """A case's folder: ``make(tmp_path / "m")``, then ``edit`` applied to it."""

    def prepare(tmp_path):
        folder = make(tmp_path / "m")
        edit(folder)
        return folder

    return prepare


def _saved_then(edit):
    return _edited(saved_model, edit)


def _cast_lola_weight(dtype):
    return lambda folder: edit_model_tensors(folder, lambda t: t.update({lola_weight(t): t[lola_weight(t)].to(dtype)}))


INTEGRATION = [
    Case("apply_lola to a model name", _apply(model="tiny-random-llama"), TypeError, "model"),
    Case("apply_lola to a bare module", _apply(model=torch.nn.Linear(2, 2)), (TypeError, ValueError), "model|attention"),
    Case("apply_lola feature_maps empty", _apply_maps(lambda t: ""), ValueError, "feature_maps is empty"),
    Case("apply_lola feature_maps a file", _apply_maps(lambda t: Path(make_file(t, "maps.bin", b"x"))), ValueError, "maps.bin' is a file"),
    Case("apply_lola feature_maps a number", _apply_maps(lambda t: 7), TypeError, "feature_maps"),
    Case(
        "apply_lola feature_maps an empty folder",
        _apply_maps(lambda t: Path(make_folder(t, "empty"))),
        FileNotFoundError,
        "empty' has no feature_maps.safetensors",
    ),
    Case("from_pretrained of a missing folder", _from_pretrained(lambda t: t / "nowhere"), (ValueError, OSError), "nowhere"),
    Case("from_pretrained of a file", _from_pretrained(lambda t: make_file(t, "model.bin", b"x")), (ValueError, OSError), "model.bin"),
    Case("from_pretrained of a number", _from_pretrained(lambda t: 7), TypeError, "path"),
    Case("config.json cut short", _from_pretrained(_saved_then(lambda f: cut(f / "config.json"))), (ValueError, OSError), "config.json"),
    Case("config.json a list", _from_pretrained(_saved_then(lambda f: (f / "config.json").write_text("[]"))), ValueError, "config.json"),
    Case("lola entry a list", _from_pretrained(_saved_then(lambda f: edit_model_config(f, lambda c: c.update(lola=[1])))), ValueError, "config.json.*lola"),
    Case(
        "lola entry a bad window",
        _from_pretrained(_saved_then(lambda f: edit_model_config(f, lambda c: c["lola"]["config"].update(window=-1)))),
        ValueError,
        "config.json.*window",
    ),
    Case("a LoLA weight as int64", _from_pretrained(_saved_then(_cast_lola_weight(torch.int64))), ValueError, "LoLA weight"),
    Case(
        "a LoLA weight of another shape",
        _from_pretrained(_saved_then(lambda f: edit_model_tensors(f, lambda t: t.update({lola_weight(t): torch.zeros(3)})))),
        ValueError,
        "LoLA weight",
    ),
    Case(
        "an extra LoLA weight",
        _from_pretrained(_saved_then(lambda f: edit_model_tensors(f, lambda t: t.update({"model.layers.0.self_attn.lola.extra": torch.zeros(1)})))),
        ValueError,
        "unexpected",
    ),
    Case(
        "the weights file cut short",
        _from_pretrained(_saved_then(lambda f: cut(next(f.glob("*.safetensors"))))),
        ValueError,
        r"model\.safetensors cannot be read",
    ),
    Case(
        "the weights file removed",
        _from_pretrained(_saved_then(lambda f: next(f.glob("*.safetensors")).unlink())),
        (ValueError, OSError),
        "safetensors|weights",
    ),
]


# -- budgets files, token scorers and feature-map folders read through the API ---------------------


def scorer_file(folder: Path, layers: int = 2, kv_heads: int = 2, head_dim: int = 8, **tensors) -> Path:
    """A valid token scorer file (zeros), with ``tensors`` replacing or adding entries."""
    from safetensors.torch import save

    from lola.scorers import FORMAT

    folder.mkdir(parents=True, exist_ok=True)
    body = {"weight": torch.zeros(layers, kv_heads, 2 * head_dim + 1), "inv_freq": torch.ones(head_dim // 2)}
    body.update(tensors)
    metadata = {"format": FORMAT, "info": json.dumps({"model": "tiny"})}
    path = folder / "scorer.safetensors"
    path.write_bytes(save({k: v for k, v in body.items() if v is not None}, metadata=metadata))
    return path


def scorer_info(folder: Path, info: str) -> Path:
    """A valid scorer file whose ``info`` metadata is ``info``."""
    path = scorer_file(folder)
    edit_safetensors(path, meta=lambda m: m.update(info=info))
    return path


def budgets_file(folder: Path, data: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "b.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _budgets(prepare):
    return lambda tmp_path: lola.budgets.load(prepare(tmp_path))


def _scorer(prepare):
    def run(tmp_path):
        from lola import scorers

        scorers.load(prepare(tmp_path))

    return run


def _maps(prepare):
    def run(tmp_path):
        from lola.pretrained.folder import read_feature_maps

        read_feature_maps(prepare(tmp_path))

    return run


def _maps_then(edit):
    return _edited(write_random_maps, edit)


def _replace_with_folder(name):
    def edit(folder):
        (folder / name).unlink()
        (folder / name).mkdir()

    return edit


def _learned_on_layer(index):
    def run(tmp_path):
        path = scorer_file(tmp_path, layers=2)
        cfg = lola.LoLAConfig(window=6, sparse_size=3, sinks=1, chunk=3, policy="learned", policy_kwargs={"scorer": str(path)})
        with torch.no_grad():
            layer(cfg, layer=index)(*qkv(1))

    return run


FILES = [
    Case("budgets name empty", _budgets(lambda t: ""), ValueError, "budgets is empty"),
    Case("budgets a folder", _budgets(lambda t: make_folder(t, "b")), ValueError, "b is a folder"),
    Case("budgets of no bytes", _budgets(lambda t: budgets_file(t, "")), ValueError, r"b\.json"),
    Case("budgets a JSON list", _budgets(lambda t: budgets_file(t, [1, 2])), ValueError, r"b\.json"),
    Case(
        "budgets rows of two lengths",
        _budgets(lambda t: budgets_file(t, {**GOOD_BUDGETS, "sparse_size_per_head": [[4, 2], [2]]})),
        ValueError,
        r"b\.json.*sparse_size_per_head",
    ),
    Case("budgets scores of another shape", _budgets(lambda t: budgets_file(t, {**GOOD_BUDGETS, "scores": [[1.0]]})), ValueError, r"b\.json.*scores"),
    Case(
        "budgets without uniform_sparse_size",
        _budgets(lambda t: budgets_file(t, {k: v for k, v in GOOD_BUDGETS.items() if k != "uniform_sparse_size"})),
        ValueError,
        "uniform_sparse_size",
    ),
    Case("budgets a dangling link", _budgets(lambda t: dangling_link(t, "b.json")), (ValueError, FileNotFoundError), r"b\.json"),
    Case(
        "budgets with a size beyond the uniform total",
        _budgets(lambda t: budgets_file(t, {**GOOD_BUDGETS, "sparse_size_per_head": [[90, 90], [90, 90]]})),
        ValueError,
        r"b\.json",
    ),
    Case("scorer name empty", _scorer(lambda t: ""), ValueError, "scorer is empty"),
    Case("scorer a folder", _scorer(lambda t: make_folder(t, "sc")), ValueError, "sc is a folder"),
    Case("scorer of no bytes", _scorer(lambda t: make_file(t, "s.safetensors")), ValueError, r"s\.safetensors"),
    Case("scorer cut short", _scorer(lambda t: cut(scorer_file(t)) or t / "scorer.safetensors"), ValueError, r"scorer\.safetensors"),
    Case(
        "scorer weight as int64", _scorer(lambda t: scorer_file(t, weight=torch.zeros(2, 2, 17, dtype=torch.int64))), ValueError, r"scorer\.safetensors.*weight"
    ),
    Case("scorer weight of two axes", _scorer(lambda t: scorer_file(t, weight=torch.zeros(2, 17))), ValueError, r"scorer\.safetensors.*weight"),
    Case("scorer with a foreign tensor", _scorer(lambda t: scorer_file(t, bias=torch.zeros(1))), ValueError, r"scorer\.safetensors.*bias"),
    Case("scorer inv_freq of another length", _scorer(lambda t: scorer_file(t, inv_freq=torch.ones(3))), ValueError, r"scorer\.safetensors.*inv_freq"),
    Case("scorer info not JSON", _scorer(lambda t: scorer_info(t, "{cut")), ValueError, r"scorer\.safetensors"),
    Case("scorer info a list", _scorer(lambda t: scorer_info(t, "[1]")), ValueError, r"scorer\.safetensors.*info"),
    Case("scorer a number", _scorer(lambda t: 7), TypeError, "scorer"),
    Case("scorer for fewer layers than the model", _learned_on_layer(5), RuntimeError, "policy 'learned' .*layer 5 is outside the scorer's 2 layers"),
    Case("maps path empty", _maps(lambda t: ""), ValueError, "feature_maps is empty"),
    Case("maps path a number", _maps(lambda t: 3), TypeError, "feature_maps must be a folder"),
    Case("maps path a file", _maps(lambda t: make_file(t, "maps.bin", b"x")), ValueError, "maps.bin' is a file"),
    Case("maps description a folder", _maps(_maps_then(_replace_with_folder("lola_config.json"))), (ValueError, FileNotFoundError), "lola_config.json"),
    Case(
        "maps tensors a folder",
        _maps(_maps_then(_replace_with_folder("feature_maps.safetensors"))),
        (ValueError, FileNotFoundError),
        "feature_maps.safetensors",
    ),
    Case("maps description of no bytes", _maps(_maps_then(lambda f: (f / "lola_config.json").write_text(""))), ValueError, "lola_config.json"),
    Case("maps description a list", _maps(_maps_then(lambda f: (f / "lola_config.json").write_text("[]"))), ValueError, "lola_config.json"),
]


@pytest.mark.parametrize("case", params(INTEGRATION + FILES))
def test_an_api_input_is_refused_naming_it(case, tmp_path):
    with pytest.raises(case.error, match=case.match):
        case.run(tmp_path)
