import pytest
import torch

from lola.memory import LinearState, QueryBlock


def test_write_and_read_are_the_outer_product_sums():
    st = LinearState()
    st.allocate(1, 2, 3, 4, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    fk, v = torch.rand(1, 2, 5, 3, generator=g), torch.randn(1, 2, 5, 4, generator=g)
    mask = torch.tensor([True, False, True, True, False]).expand(1, 2, 5)
    st.write(fk, v.bfloat16(), mask)
    assert st.H.dtype == torch.float32
    keep = mask[0, 0]
    H = torch.einsum("bhnf,bhnd->bhfd", fk[:, :, keep], v.bfloat16().float()[:, :, keep])
    torch.testing.assert_close(st.H, H)
    torch.testing.assert_close(st.s, fk[:, :, keep].sum(2))
    fq = torch.rand(1, 2, 1, 3, generator=g)
    part = st.read(QueryBlock(fq, fq, torch.zeros(1, 1, dtype=torch.long), 1.0))
    torch.testing.assert_close(part.num, fq @ H)


def test_state_dict_validation():
    st = LinearState()
    with pytest.raises(ValueError, match="float32"):
        st.load_state_dict({"H": torch.zeros(1, 1, 2, 2, dtype=torch.bfloat16), "s": torch.zeros(1, 1, 2)})
    with pytest.raises(RuntimeError, match="not allocated"):
        st.read(None)  # the allocation is checked before the query
