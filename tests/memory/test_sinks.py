import torch

from lola.memory import SinkTokens


def test_sinks_take_positions_below_n_into_slot_pos():
    sinks = SinkTokens(3)
    sinks.allocate(2, 1, 2, torch.float32, torch.device("cpu"), False)
    pos = torch.tensor([[-1, 0, 1], [2, 3, 4]])
    k = pos.float()[:, None, :, None].expand(2, 1, 3, 2)
    taken = sinks.write(k, k, pos)
    assert taken.tolist() == [[False, True, True], [True, False, False]]
    assert sinks.block.pos[0, 0].tolist() == [0, 1, -1]
    assert sinks.block.pos[1, 0].tolist() == [-1, -1, 2]
    assert sinks.block.k[1, 0, 2, 0] == 2.0 and sinks.block.k[0, 0, 1, 0] == 1.0


def test_zero_sinks_take_nothing():
    sinks = SinkTokens(0)
    sinks.allocate(1, 1, 2, torch.float32, torch.device("cpu"), False)
    pos = torch.tensor([[0, 1]])
    assert not sinks.write(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), pos).any()
    assert sinks.nbytes() == 0
