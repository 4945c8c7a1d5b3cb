import pytest
import torch

from lola.schedules import Chunkwise, Tokenwise, UpdateSchedule


def test_chunkwise_steps_after_multiples_of_c():
    seen = torch.arange(10)
    until = Chunkwise(4).tokens_until_step(seen)
    # the step falls on position seen + until - 1, which must be 3, 7, 11, ...
    assert torch.all((seen + until) % 4 == 0)
    assert torch.all((until >= 1) & (until <= 4))


def test_tokenwise_every_token():
    assert torch.equal(Tokenwise().tokens_until_step(torch.arange(5)), torch.ones(5, dtype=torch.long))
    assert Tokenwise().period == 1 == Chunkwise(1).period


@pytest.mark.parametrize("bad", [0, -2, 1.5])
def test_chunk_must_be_positive_int(bad):
    with pytest.raises(ValueError, match="chunk"):
        Chunkwise(bad)


def test_protocol():
    assert isinstance(Chunkwise(3), UpdateSchedule) and isinstance(Tokenwise(), UpdateSchedule)
