"""A decoded token's fused read (lola.engine.decode_read): the token read by one decode_step
equals its read in a prefill of the same tokens; a read never made is an error."""

import pytest
import torch

import lola
from lola.engine.decode_read import DecodeRead
from tests.oracles import assert_rel_close


@pytest.mark.parametrize("mixing", ["lolcats", "lola_authors", "softmax_only"])
@pytest.mark.parametrize("sizes", [{"sparse_size": 3}, {"sparse_size": 3, "sparse_size_per_head": [1, 4]}])
def test_a_decoded_token_reads_as_in_a_prefill(mixing, sizes):
    cfg = lola.LoLAConfig(window=4, sinks=1, chunk=3, mixing=mixing, **sizes)
    attn = lola.compose(cfg, num_heads=4, head_dim=8, num_kv_heads=2)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 20, h, 8, generator=g) for h in (4, 2, 2))
    with torch.no_grad():
        whole, _ = attn(q, k, v)
        _, state = attn(q[:, :19], k[:, :19], v[:, :19])
        last, _ = attn(q[:, 19:], k[:, 19:], v[:, 19:], state=state)  # one token: the fused decode read
    assert_rel_close(whole[:, 19:], last, 1e-5)


def test_a_token_never_read_is_an_error():
    attn = lola.compose(lola.LoLAConfig(), num_heads=2, head_dim=8)
    read = DecodeRead(attn.new_state(), torch.zeros(1, 2, 1, 8), None, 1.0, torch.ones(2), "softmax_only")
    read.add(0, 0)  # the loop asks for no query before a step: nothing is read
    with pytest.raises(RuntimeError, match="was not read"):
        read.result()
