import pytest
import torch

from lola.eval.mqar import make_mqar, mqar_accuracy


def test_every_query_is_labelled_with_its_value():
    inputs, labels = make_mqar(8, 128, 8, vocab_size=256, seed=3)
    assert inputs.shape == labels.shape == (8, 128)
    for x, y in zip(inputs, labels):
        keys, values = x[0:16:2], x[1:16:2]
        assert len(set(keys.tolist())) == 8 and keys.min() >= 1 and keys.max() < 128
        assert values.min() >= 128 and values.max() < 256
        pairs = dict(zip(keys.tolist(), values.tolist()))
        at = (y != -100).nonzero().flatten()
        assert len(at) == 8 and at.min() >= 16
        assert sorted(x[at].tolist()) == sorted(keys.tolist())  # every key asked once
        assert all(pairs[int(x[p])] == int(y[p]) for p in at)
        assert torch.all(x[16:][y[16:] == -100] == 0)


def test_power_law_favours_early_queries_and_is_seeded():
    a = make_mqar(200, 512, 16, seed=1)
    assert torch.equal(a[0], make_mqar(200, 512, 16, seed=1)[0])
    pos = (a[1] != -100).nonzero()[:, 1].float()
    assert pos.median() < 32 + (512 - 32) / 2  # earlier than uniform


def test_accuracy_and_errors():
    inputs, labels = make_mqar(2, 32, 4, vocab_size=64)
    perfect = torch.nn.functional.one_hot(labels.clamp(min=0), 64).float()
    assert mqar_accuracy(perfect, labels) == 1.0
    # Wrong answers count, unlabelled positions do not: the prediction at exactly the first half
    # of the labelled positions moved to another token, and every unlabelled one garbled.
    labelled = (labels != -100).nonzero().tolist()
    wrong = perfect.clone()
    for n, i in labelled[: len(labelled) // 2]:
        wrong[n, i] = torch.nn.functional.one_hot((labels[n, i] + 1) % 64, 64).float()
    wrong[labels == -100] = torch.randn(int((labels == -100).sum()), 64)
    assert mqar_accuracy(wrong, labels) == (len(labelled) - len(labelled) // 2) / len(labelled)
    with pytest.raises(ValueError, match="seq_len"):
        make_mqar(1, 10, 4)
    with pytest.raises(ValueError, match="distinct keys"):
        make_mqar(1, 64, 10, vocab_size=16)
    with pytest.raises(ValueError, match="labelled"):
        mqar_accuracy(perfect, torch.full_like(labels, -100))
