"""A state's size is bounded by a limit the user can raise, before anything is allocated
(lola.memory.allocation): a typo such as a window of 2**24 tokens per head is refused even on a
machine with the memory for it, and raising the limit lets a deliberate size through."""

import pytest
import torch

import lola
from lola.layer import compose
from lola.memory import allocation


@pytest.fixture(autouse=True)
def plenty_of_memory(monkeypatch):
    """Pretend the machine has 1 TiB free, so only the limit can refuse; restore the limit after."""
    monkeypatch.setattr(allocation, "available_bytes", lambda device: None if torch.device(device).type == "meta" else 2**40)
    monkeypatch.delenv("LOLA_MAX_STATE_BYTES", raising=False)
    yield
    lola.set_max_state_bytes(None)


def _attend(config, batch=1, tokens=4):
    attn = compose(config, num_heads=4, head_dim=64, num_kv_heads=2)
    x = torch.randn(batch, tokens, 4, 64)
    state = attn.new_state()
    return attn, state, lambda: attn(x, x[:, :, :2], x[:, :, :2], state=state)


@pytest.mark.parametrize("field, named", [("window", "window 16777"), ("sinks", "sinks 16777216"), ("sparse_size", "sparse 16777216")])
def test_a_huge_memory_on_four_tokens_is_refused_under_the_default_limit(field, named):
    _, state, run = _attend(lola.LoLAConfig(**{field: 2**24}))
    with pytest.raises(
        MemoryError, match=rf"{named}.*holds \d+\.\d\d GiB, over the limit of 4\.00 GiB per layer.*LOLA_MAX_STATE_BYTES or lola\.set_max_state_bytes"
    ):
        run()
    assert not state.allocated


def test_raising_the_limit_lets_the_size_through_to_the_free_memory_check(monkeypatch):
    _, state, run = _attend(lola.LoLAConfig(window=2**24))
    lola.set_max_state_bytes(2**50)
    monkeypatch.setattr(allocation, "available_bytes", lambda device: 2**20)  # then only the machine refuses
    with pytest.raises(MemoryError, match="needs .* GiB on cpu, but only 0.00 GiB is free"):
        run()
    assert not state.allocated


def test_the_limit_counts_the_batch():
    config = lola.LoLAConfig(window=4096, sparse_size=64)
    _, _, run = _attend(config, batch=2)
    run()  # about 4 MiB a row: far below
    lola.set_max_state_bytes(2**20)  # 1 MiB
    _, state, run = _attend(config, batch=2)
    with pytest.raises(MemoryError, match=r"batch 2.*over the limit of 0\.00 GiB"):
        run()
    assert not state.allocated


def test_the_environment_sets_the_limit_and_a_bad_value_is_named(monkeypatch):
    monkeypatch.setenv("LOLA_MAX_STATE_BYTES", "1024")
    assert lola.max_state_bytes() == 1024
    _, state, run = _attend(lola.LoLAConfig(window=64, sparse_size=64))
    with pytest.raises(MemoryError, match="over the limit"):
        run()
    lola.set_max_state_bytes(2**30)  # the call wins over the environment
    assert lola.max_state_bytes() == 2**30
    lola.set_max_state_bytes(None)
    for bad in ("-1", "0", "4GiB", "1e9"):
        monkeypatch.setenv("LOLA_MAX_STATE_BYTES", bad)
        with pytest.raises(ValueError, match=rf"LOLA_MAX_STATE_BYTES must be a positive integer number of bytes, got '{bad}'"):
            lola.max_state_bytes()


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "4096"])
def test_set_max_state_bytes_refuses_what_is_not_a_positive_integer(bad):
    with pytest.raises(ValueError, match="limit must be a positive integer number of bytes or None"):
        lola.set_max_state_bytes(bad)
    assert lola.max_state_bytes() == allocation.DEFAULT_MAX_STATE_BYTES


def test_meta_states_are_never_refused():
    allocation.check_allocation(2**60, torch.device("meta"), "x", held=2**60)
