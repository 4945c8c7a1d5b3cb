"""The trainer both stages run: steps over a seeded item order, the step loss as the sum of
what the items return, and a checkpoint that a later run resumes to the same parameters."""

import pytest
import torch
from pydantic import BaseModel

from lola.linearize.distributed import World
from lola.linearize.trainer import Trainer

TARGETS = torch.linspace(-1.0, 1.0, 6)


class Options(BaseModel):
    steps: int = 6
    lr: float = 0.1
    text: str = "corpus"


def _trainer(path, options):
    w = torch.nn.Parameter(torch.zeros(()))
    opt = torch.optim.SGD([w], lr=options.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    return w, Trainer([w], opt, schedule, World(), path, options, {"layers": 1}, {"text": "t"})


def _run(trainer, w, steps, seen=None, stop_after=None):
    def item(i, share):
        if seen is not None:
            seen.append(i)
            if stop_after is not None and len(seen) > stop_after:
                raise KeyboardInterrupt
        loss = (w - TARGETS[i]) ** 2 / share
        loss.backward()
        return loss.detach()

    trainer.run(
        steps=steps, batch=2, items=6, seed=0, train_item=item, stage_state=lambda: {"w": w.detach().clone()}, checkpoint_every=2, desc="test", progress=False
    )


def test_step_loss_is_the_sum_of_the_items_and_the_order_is_seeded(tmp_path):
    w, trainer = _trainer(tmp_path / "ckpt.pt", Options())
    seen = []
    _run(trainer, w, 6, seen)
    order = torch.randperm(6, generator=torch.Generator().manual_seed(0)).tolist()
    assert seen == [order[j % 6] for j in range(12)]  # two items a step, wrapping around
    # recompute by hand: SGD on the mean of two squared errors, lr 0.1 / (1 + step)
    v, expected = 0.0, []
    for step in range(6):
        a, b = (TARGETS[order[(2 * step + j) % 6]].item() for j in range(2))
        expected.append(((v - a) ** 2 + (v - b) ** 2) / 2)
        v -= 0.1 / (1 + step) * ((v - a) + (v - b))
    assert trainer.losses == pytest.approx(expected, rel=1e-5)
    assert float(w.detach()) == pytest.approx(v, rel=1e-5)
    assert trainer.processed == 12 and trainer.step == 6


def test_an_interrupted_run_resumes_to_the_same_parameters(tmp_path):
    w_whole, whole = _trainer(tmp_path / "whole.pt", Options())
    _run(whole, w_whole, 6)
    w, first = _trainer(tmp_path / "part.pt", Options())
    with pytest.raises(KeyboardInterrupt):
        _run(first, w, 6, seen=[], stop_after=7)  # dies in step 4: the last checkpoint is step 2's
    w2, second = _trainer(tmp_path / "part.pt", Options())
    state = second.resume()
    assert state is not None and second.step == 2 and len(second.losses) == 2
    w2.data.copy_(state["w"])
    _run(second, w2, 6)
    assert second.losses == pytest.approx(whole.losses, rel=1e-6)
    assert float(w2.detach()) == pytest.approx(float(w_whole.detach()), rel=1e-6)


def test_a_checkpoint_of_other_options_is_refused(tmp_path):
    w, trainer = _trainer(tmp_path / "ckpt.pt", Options())
    _run(trainer, w, 2)
    _, other = _trainer(tmp_path / "ckpt.pt", Options(lr=0.2))
    with pytest.raises(ValueError, match="lr"):
        other.resume()


def test_the_run_s_sizes_default_to_the_stage_s_options(tmp_path):
    class Stage(BaseModel):
        steps: int = 3
        batch: int = 2
        seed: int = 0
        checkpoint_every: int = 1
        lr: float = 0.1

    w, trainer = _trainer(tmp_path / "ckpt.pt", Stage())
    seen = []

    def item(i, share):
        seen.append(i)
        loss = (w - TARGETS[i]) ** 2 / share
        loss.backward()
        return loss.detach()

    trainer.run(items=6, train_item=item, stage_state=lambda: {}, desc="test", progress=False)
    order = torch.randperm(6, generator=torch.Generator().manual_seed(0)).tolist()
    assert trainer.step == 3 and seen == [order[j] for j in range(6)]
