"""lola.core.checks: value checks read back on the CPU, assert asynchronously elsewhere, so the
decode path reads nothing back per token on an accelerator."""

import pytest
import torch

import lola
import lola.core.checks as checks
from lola.integrations.transformers import LoLACache, apply_lola
from lola.models import tiny_random
from tests.host_reads import count_host_reads


def test_require_reads_back_on_the_host_and_asserts_elsewhere(monkeypatch):
    assert checks.require(torch.tensor(True), "m") is True
    assert checks.require(torch.tensor(False), "m") is False
    monkeypatch.setattr(checks, "HOST_DEVICES", frozenset())  # the CPU as an accelerator
    assert checks.require(torch.tensor(True), "m") is True
    with pytest.raises(RuntimeError, match="the message"):  # torch._assert_async, synchronous on the CPU
        checks.require(torch.tensor(False), "the message")


def test_decoding_reads_nothing_back_between_steps_on_an_accelerator(monkeypatch):
    model, _ = tiny_random()
    apply_lola(model, lola.LoLAConfig(window=16, sparse_size=8, sinks=2, chunk=64))  # check_inputs on, as by default
    cache = LoLACache(model)
    ids = torch.randint(0, 200, (1, 40), generator=torch.Generator().manual_seed(0))
    decode = lambda token: model(token, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)  # noqa: E731

    def reads_while_decoding(tokens: int) -> int:
        with torch.no_grad():
            nxt = decode(ids)
            nxt = decode(nxt)  # the first decoded token asks the schedule once (a read at a step boundary)
            with count_host_reads() as reads:
                for _ in range(tokens):  # positions 42..57: no step falls (chunk 64)
                    nxt = decode(nxt)
        return sum(reads.values())

    assert reads_while_decoding(16) > 0  # on the CPU the input check reads its flag back: the counter sees it
    monkeypatch.setattr(checks, "HOST_DEVICES", frozenset())
    cache = LoLACache(model)
    assert reads_while_decoding(16) == 0
