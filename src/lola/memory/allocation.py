"""Memory checked before it is allocated: a state too large for the device is an error that
names the sizes, not an out-of-memory kill.

A LoLA state is allocated once per layer at a sequence's first call; its size is known from the
config, the batch and the model's shape, so :meth:`lola.composer.LoLAMemory.allocate` checks it
against the memory the device has free (``torch.cuda.mem_get_info`` on CUDA, the kernel's
``MemAvailable`` on the CPU, lowered to what the process's address-space limit and its cgroup's
memory limit leave) and refuses what cannot fit.
"""

from __future__ import annotations

import os

import torch

__all__ = ["available_bytes", "check_allocation"]


def available_bytes(device: torch.device) -> int | None:
    """Bytes free on ``device``, or ``None`` where it cannot be told (then nothing is refused)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    limits = [x for x in (_system_available(), _address_space_left(), _cgroup_left()) if x is not None]
    return min(limits) if limits else None


def _system_available() -> int | None:
    """The kernel's estimate of memory available to new allocations (``MemAvailable``)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def _address_space_left() -> int | None:
    """What this process's address-space limit (``ulimit -v``) leaves, or ``None`` if unlimited."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return max(soft - int(line.split()[1]) * 1024, 0)
    except (ImportError, OSError, ValueError):  # pragma: no cover - not Linux
        pass
    return None


def _cgroup_left() -> int | None:
    """What this process's cgroup (v2) memory limit leaves (a container's limit), or ``None``."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next((line.strip().split(":", 2)[2] for line in f if line.startswith("0::")), None)
        if path is None:
            return None
        folder = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
        with open(os.path.join(folder, "memory.max")) as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open(os.path.join(folder, "memory.current")) as f:
            return max(int(limit) - int(f.read().strip()), 0)
    except (OSError, ValueError, StopIteration):
        return None


def check_allocation(nbytes: int, device: torch.device, what: str, available: int | None = None) -> None:
    """Refuse to allocate ``nbytes`` on ``device`` if more than that is not free.

    Args:
        nbytes: what the allocation needs.
        device: where it goes.
        what: what is allocated and from which settings, for the message.
        available: bytes free (default: :func:`available_bytes`).

    Raises:
        MemoryError: naming ``what``, the bytes needed and the bytes free.
    """
    free = available_bytes(device) if available is None else available
    if free is not None and nbytes > free:
        raise MemoryError(f"{what} needs {nbytes / 2**30:.2f} GiB on {device}, but only {free / 2**30:.2f} GiB is free; lower those sizes or the batch")
