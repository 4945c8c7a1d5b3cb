"""A tiny linearized folder, written once per test module that asks for it."""

import pytest

from lola.linearize import LinearizeConfig, linearize
from lola.models import tiny_random


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("maps")
    model, tok = tiny_random()
    linearize(
        model, tok, LinearizeConfig(steps=2, chunk_tokens=64, train_chunks=1, eval_chunks=1, window=8, text=["pydoc"]), out, progress=False, log=lambda s: None
    )
    return out
