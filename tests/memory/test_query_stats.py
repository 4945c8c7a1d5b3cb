import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lola.memory import QueryStatistics


def naive_stats(queries: list[torch.Tensor], half_life: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted mean and covariance of ``queries`` (oldest first, each [D]) by explicit weights."""
    beta = 0.5 ** (1.0 / half_life)
    w = [beta ** (len(queries) - 1 - i) for i in range(len(queries))]
    mu = sum(wi * q.double() for wi, q in zip(w, queries)) / sum(w)
    cov = sum(wi * torch.outer(q.double() - mu, q.double() - mu) for wi, q in zip(w, queries)) / sum(w)
    return mu, cov


@given(
    t=st.integers(1, 24),
    d=st.integers(1, 5),
    half_life=st.floats(0.5, 50.0),
    pads=st.lists(st.integers(0, 6), min_size=2, max_size=2),
    data=st.data(),
)
def test_any_split_with_padding_matches_the_weighted_statistics(t, d, half_life, pads, data):
    # Two rows, two heads; each call's active queries come first (as the composer packs them).
    g = torch.Generator().manual_seed(t * 31 + d)
    q = torch.randn(2, 2, t, d, generator=g)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, t - 1)), max_size=5)))) if t > 1 else []
    stats = QueryStatistics(half_life)
    stats.allocate(2, 2, d, torch.device("cpu"))
    bounds = [0, *cuts, t]
    for a, b in zip(bounds, bounds[1:]):
        length = b - a
        extra = [min(p, 3) for p in pads]  # inactive trailing entries hold garbage
        width = length + max(extra)
        block = torch.full((2, 2, width, d), 1e4)
        active = torch.zeros(2, width, dtype=torch.bool)
        for row in range(2):
            block[row, :, :length] = q[row, :, a:b]
            active[row, :length] = True
        stats.update(block, active)
    mean, cov = stats.mean(), stats.covariance()
    for row in range(2):
        for h in range(2):
            mu, c = naive_stats(list(q[row, h]), half_life)
            torch.testing.assert_close(mean[row, h].double(), mu, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(cov[row, h].double(), c, rtol=1e-4, atol=1e-4)


def test_state_round_trip_and_validation():
    stats = QueryStatistics(8)
    stats.allocate(1, 3, 4, torch.device("cpu"))
    stats.update(torch.randn(1, 3, 5, 4), torch.ones(1, 5, dtype=torch.bool))
    other = QueryStatistics(8)
    other.load_state_dict(stats.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), stats.state_dict().values()))
    assert stats.nbytes() == 4 * (3 + 3 * 4 + 3 * 16)
    with pytest.raises(ValueError, match="half_life"):
        QueryStatistics(0)
    with pytest.raises(ValueError, match="half_life"):
        QueryStatistics(math.inf)
    with pytest.raises(ValueError, match="exactly"):
        other.load_state_dict({"n": torch.zeros(1, 3)})
