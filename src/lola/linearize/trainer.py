"""The training loop both linearization stages run: one resumable trainer.

A stage supplies what it trains (its parameters, optimizer and learning-rate schedule), how one
training item's loss is computed and back-propagated, and what else its checkpoint keeps; the
trainer does the rest, the same way for both: the process's device and place in a
``torchrun`` job (:func:`start`), the item order and each step's share per process, gradient
averaging, the optimizer and schedule steps, the loss log (summed on the device, read back once
per step), progress, and a checkpoint every ``checkpoint_every`` steps that a later call with the
same options resumes exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from lola.linearize.checkpoint import read_checkpoint, write_checkpoint
from lola.linearize.distributed import World, all_reduce_mean, average_gradients, init_world, resolve_device

__all__ = ["Trainer", "start"]


def start(device_name: str, batch: int, out: Path, seed: int) -> tuple[torch.device, World]:
    """Set up this process for a stage: its device (one GPU per rank under ``torchrun``), its
    :class:`~lola.linearize.distributed.World`, the output folder (rank 0) and the seed.

    Raises:
        ValueError: ``batch`` is not a multiple of the number of processes.
    """
    device = resolve_device(device_name)
    world = init_world(device)
    if batch % world.size:
        raise ValueError(f"batch ({batch}) must be a multiple of the number of processes ({world.size})")
    if world.size > 1 and device.type == "cuda":
        device = torch.device("cuda", world.rank % torch.cuda.device_count())
    if world.main:
        out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    return device, world


@dataclass
class Trainer:
    """Runs a stage's steps, resumably.

    Attributes:
        params: the trained parameters (their gradients are averaged over the processes).
        optimizer, schedule: the stage's optimizer and its ``LambdaLR`` schedule (stepped once
            per step).
        world: this process's place in the job.
        checkpoint: the checkpoint file; read by :meth:`resume`, written by :meth:`run`.
        config: the stage's options (a pydantic model): a checkpoint of other options is refused.
        geometry: the model's geometry, checked the same way.
        inputs: content fingerprints of what the run reads (text, teacher, starting maps).
        steps_option: the option that sets the number of steps, named in errors (``--steps``).
        losses: the mean training loss of every step so far.
        train_s: seconds spent training so far (without what ``untimed`` reports).
        processed: items this process trained on in this call.
    """

    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    world: World
    checkpoint: Path
    config: Any
    geometry: dict
    inputs: dict
    steps_option: str = "--steps"
    losses: list[float] = field(default_factory=list)
    train_s: float = 0.0
    processed: int = 0
    step: int = 0

    def read(self) -> dict | None:
        """The checkpoint's state when :attr:`checkpoint` exists, after checking that it was
        written by a run of the same options, geometry and inputs; else ``None``."""
        if not (self.checkpoint.exists() or self.checkpoint.is_symlink()):
            return None
        return read_checkpoint(self.checkpoint, self.config, self.geometry, self.steps_option, self.inputs)

    def resume(self, state: dict | None = None) -> dict | None:
        """Restore the optimizer, schedule, losses and step from ``state`` (default: :meth:`read`);
        returns the whole state (the stage restores its own entries), ``None`` for a fresh run."""
        state = self.read() if state is None else state
        if state is None:
            return None
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        self.step, self.losses, self.train_s = int(state["step"]), list(state["losses"]), float(state["train_s"])
        return state

    def save(self, stage_state: dict) -> None:
        """Write the checkpoint (rank 0): the common state and the stage's ``stage_state``."""
        if not self.world.main:
            return
        state = {
            "step": self.step,
            "config": self.config.model_dump(),
            "geometry": self.geometry,
            "losses": self.losses,
            "train_s": self.train_s,
            "inputs": self.inputs,
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            **stage_state,
        }
        write_checkpoint(self.checkpoint, state)

    def run(
        self,
        *,
        items: int,
        train_item: Callable[[int, int], torch.Tensor],
        stage_state: Callable[[], dict],
        desc: str,
        steps: int | None = None,
        batch: int | None = None,
        seed: int | None = None,
        checkpoint_every: int | None = None,
        progress: bool = True,
        untimed: Callable[[], float] = lambda: 0.0,
        loss_format: str = ".4f",
    ) -> None:
        """Train from :attr:`step` to ``steps``.

        Each step takes ``batch`` items of a seeded order of ``range(items)`` (wrapping around),
        this process its share of them; ``train_item(index, share)`` computes one item's loss,
        divided by ``share`` (the items this process trains on this step), back-propagates it and
        returns it detached (a 0-dim tensor on the device): the step's loss is their sum, read
        back once. ``untimed()`` is the cumulative time not to count as training (the teacher's
        activations collected on demand). ``steps``, ``batch``, ``seed`` and ``checkpoint_every``
        are the stage's options (:attr:`config`'s fields of those names) unless given.
        """
        from tqdm.auto import tqdm

        steps, batch, seed, checkpoint_every = (
            getattr(self.config, name) if value is None else value
            for name, value in (("steps", steps), ("batch", batch), ("seed", seed), ("checkpoint_every", checkpoint_every))
        )

        order = torch.randperm(items, generator=torch.Generator().manual_seed(seed)).tolist()
        bar = tqdm(range(self.step, steps), desc=desc, unit="step", initial=self.step, total=steps, disable=not (progress and self.world.main))
        for step in bar:
            t, excluded = time.perf_counter(), untimed()
            mine = self.world.shard([order[(step * batch + j) % len(order)] for j in range(batch)])
            total: torch.Tensor | float = 0.0
            for index in mine:
                self.processed += 1
                total = total + train_item(index, len(mine))
            average_gradients(self.params, self.world)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.schedule.step()
            self.losses.append(all_reduce_mean(float(total), self.world))
            self.train_s += time.perf_counter() - t - (untimed() - excluded)
            self.step = step + 1
            bar.set_postfix(loss=format(self.losses[-1], loss_format))
            if self.step % checkpoint_every == 0 or self.step == steps:
                self.save(stage_state())

    def loss_summary(self) -> dict:
        """The report's ``train_loss`` entry."""
        return {"first": self.losses[0] if self.losses else None, "last": self.losses[-1] if self.losses else None, "every_step": self.losses}
