"""Data-parallel linearization: two processes under torchrun (gloo, CPU) train what one process
trains with the same global batch, both stages."""

import os
import subprocess
import sys

import torch

from lola.cli import main
from lola.linearize import read_feature_maps
from lola.linearize.distributed import World

ARGS = [
    "linearize",
    "--model",
    "tiny-random-llama",
    "--text",
    "pydoc",
    "--stage",
    "all",
    "--batch",
    "2",
    "--chunk-tokens",
    "64",
    "--train-chunks",
    "4",
    "--eval-chunks",
    "2",
    "--window",
    "8",
    "--steps",
    "3",
    "--stage2-steps",
    "3",
    "--lora-lr",
    "1e-2",
    "--maps-lr",
    "1e-2",
    "--checkpoint-every",
    "2",
    "--device",
    "cpu",
]


def test_world_shards_every_nth_item():
    assert World(0, 2).shard([5, 6, 7, 8]) == [5, 7] and World(1, 2).shard([5, 6, 7, 8]) == [6, 8]
    assert World().shard([1, 2]) == [1, 2] and World().main and not World(1, 2).main


def test_two_processes_equal_one(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*ARGS, "--out", str(one)]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "lola.cli", *ARGS, "--out", str(two)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    a, b = read_feature_maps(one), read_feature_maps(two)
    assert a.lora is not None and set(a.lora) == set(b.lora) and set(a.tensors) == set(b.tensors)
    for k in a.tensors:
        torch.testing.assert_close(b.tensors[k], a.tensors[k], rtol=1e-4, atol=1e-5)
    for k in a.lora:
        torch.testing.assert_close(b.lora[k], a.lora[k], rtol=1e-4, atol=1e-5)
    # the work was split: each of the two processes trained on half of the sequences
    import json

    for name, steps in (("report.json", 3), ("finetune_report.json", 3)):
        r1, r2 = (json.loads((d / name).read_text()) for d in (one, two))
        assert (r1["processes"], r1["sequences_per_process"]) == (1, 2 * steps)
        assert (r2["processes"], r2["sequences_per_process"]) == (2, steps)
    # and training did move them (the comparison is not between two untouched initialisations)
    assert any(float(t.abs().max()) > 0 for k, t in a.lora.items() if "lora_B" in k)
