"""Data-parallel training with ``torch.distributed``, launched by ``torchrun``.

``torchrun --standalone --nproc_per_node N -m lola.cli linearize …`` starts N processes with
``RANK``/``WORLD_SIZE`` set; each takes every N-th sequence of a step's global batch, and the
gradients are averaged with one all-reduce per step, so N processes compute what one process
computes with the same global batch (up to float summation order). gloo on CPU, NCCL on CUDA.
Only rank 0 writes files and shows progress.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable

import torch

__all__ = ["World", "all_reduce_mean", "average_gradients", "init_world", "resolve_device"]


def resolve_device(name: str) -> torch.device:
    """``"auto"``: CUDA when available, else the CPU; ``"cuda"`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but torch sees no CUDA device")
    return torch.device(name)


@dataclass(frozen=True)
class World:
    """This process's place in the job: ``rank`` of ``size`` (``size == 1``: no distribution)."""

    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        """Whether this process writes files and logs."""
        return self.rank == 0

    def shard(self, items: list) -> list:
        """This rank's share of a step's global batch: every ``size``-th item from ``rank``."""
        return items[self.rank :: self.size]

    def barrier(self) -> None:
        if self.size > 1:
            torch.distributed.barrier()


def init_world(device: torch.device | str = "cpu") -> World:
    """Join the process group when launched by ``torchrun`` (``WORLD_SIZE > 1``), else a world of one."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
    return World(rank=dist.get_rank(), size=dist.get_world_size())


def average_gradients(params: Iterable[torch.nn.Parameter], world: World) -> None:
    """Replace each gradient by its mean over the processes (one flat all-reduce)."""
    if world.size == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    torch.distributed.all_reduce(flat)
    flat /= world.size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def all_reduce_mean(value: float, world: World) -> float:
    """The mean of a scalar over the processes (for logged losses)."""
    if world.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return float(t.item()) / world.size
