import math

import pytest
import torch

from lola.feature_maps import FEATURE_MAPS, HedgehogFeatureMap, build_feature_map


@pytest.mark.parametrize("name", FEATURE_MAPS)
def test_shapes_dtype_and_positive_kernel(name):
    fm = build_feature_map(name, num_heads=3, head_dim=6, feature_dim=5)
    x = torch.randn(2, 3, 7, 6, dtype=torch.bfloat16)
    out = fm(x)
    assert out.shape == (2, 3, 7, fm.feature_dim) and out.dtype == torch.float32
    y = fm(torch.randn(2, 3, 7, 6))
    assert (torch.einsum("bhnf,bhmf->bhnm", out, y) > 0).all()


def test_feature_dims():
    assert build_feature_map("hedgehog", 2, 8, 5).feature_dim == 10
    assert build_feature_map("hedgehog_identity", 2, 8).feature_dim == 16
    assert build_feature_map("elu", 2, 8).feature_dim == 8
    assert build_feature_map("taylor", 2, 8).feature_dim == 1 + 8 + 64


def test_taylor_kernel_is_second_order_exp():
    fm = build_feature_map("taylor", 1, 4)
    q, k = torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4)
    x = float((q * k).sum()) / math.sqrt(4)
    assert float((fm(q) * fm(k)).sum()) == pytest.approx(1 + x + x * x / 2, rel=1e-5)


def test_hedgehog_layout_and_identity():
    fm = HedgehogFeatureMap(4, 8, identity=True)
    assert fm.mlp.layer.shape == (4, 8, 8)
    assert torch.equal(fm.mlp.layer[2], torch.eye(8))
    x = torch.randn(1, 4, 2, 8)
    torch.testing.assert_close(fm(x), torch.cat([x.softmax(-1), (-x).softmax(-1)], -1))


def test_unknown_name():
    with pytest.raises(ValueError, match="feature_map"):
        build_feature_map("relu", 1, 2)
