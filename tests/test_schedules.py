from dataclasses import dataclass

import pytest
import torch

import lola
from lola import schedules
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


# -- the registry and the entry-point group ----------------------------------------------------


@dataclass(frozen=True)
class EveryOtherChunk:
    """A schedule lola does not ship: steps after positions C-1, 3C-1, 5C-1, … (period 2C)."""

    chunk: int

    @property
    def period(self) -> int:
        return 2 * self.chunk

    def tokens_until_step(self, seen):
        return 2 * self.chunk - seen % (2 * self.chunk)


def _layer_outputs(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 37, 2, 8, generator=g) for _ in range(3))
    torch.manual_seed(0)
    o, state = lola.compose(cfg, num_heads=2, head_dim=8)(q, k, v)
    return o, state


def test_built_in_schedules_are_registered():
    assert {"chunkwise", "tokenwise"} <= set(schedules.available())
    assert schedules.build("chunkwise", chunk=5) == Chunkwise(5)
    assert schedules.build("tokenwise", chunk=5) == Tokenwise()
    with pytest.raises(ValueError, match="unknown schedule 'nope'; available: .*chunkwise"):
        schedules.build("nope", chunk=2)


def test_a_registered_schedule_is_chosen_from_the_config():
    schedules.register("every_second_chunk", lambda chunk: EveryOtherChunk(chunk))
    try:
        cfg = lola.LoLAConfig(window=8, sparse_size=4, chunk=4, schedule="every_second_chunk")
        o, state = _layer_outputs(cfg)
        assert state.schedule == EveryOtherChunk(4)
        # every other step of chunkwise(4) is chunkwise(8) shifted by nothing: the same steps
        o8, _ = _layer_outputs(lola.LoLAConfig(window=8, sparse_size=4, chunk=8))
        torch.testing.assert_close(o, o8)
        o4, _ = _layer_outputs(lola.LoLAConfig(window=8, sparse_size=4, chunk=4))
        assert not torch.allclose(o, o4)
    finally:
        schedules.unregister("every_second_chunk")


def test_unknown_schedules_and_bad_factories_are_refused():
    with pytest.raises(ValueError, match="schedule"):
        lola.LoLAConfig(schedule="no_such_schedule")
    schedules.register("broken", lambda chunk: object())
    try:
        with pytest.raises(ValueError, match="expected an UpdateSchedule"):
            schedules.build("broken", chunk=2)
    finally:
        schedules.unregister("broken")
    with pytest.raises(ValueError, match="already registered"):
        schedules.register("chunkwise", lambda chunk: Chunkwise(chunk))


def test_entry_point_route(installed_plugin):
    source = """
        from lola.schedules import Chunkwise

        def doubled(chunk):
            return Chunkwise(2 * chunk)
        """
    installed_plugin("thirdparty_schedule", source, "lola.schedules", "doubled", "doubled")
    try:
        schedules.reload_entry_points()
        assert "doubled" in schedules.available()
        _, state = _layer_outputs(lola.LoLAConfig(window=8, sparse_size=4, chunk=3, schedule="doubled"))
        assert state.schedule == Chunkwise(6)
    finally:
        schedules.unregister("doubled")
