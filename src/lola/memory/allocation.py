"""Memory checked before it is allocated: a state too large for the device is an error that
names the sizes, not an out-of-memory kill.

A LoLA state is allocated once per layer at a sequence's first call; its size is known from the
config, the batch and the model's shape, so :meth:`lola.LoLAMemory.allocate` checks it
against the memory the device has free (``torch.cuda.mem_get_info`` on CUDA, the kernel's
``MemAvailable`` on the CPU, lowered to what the process's address-space limit and its cgroup's
memory limit leave) and refuses what cannot fit.

It is also checked against a limit the user sets (:func:`max_state_bytes`, default 4 GiB per
layer, ``LOLA_MAX_STATE_BYTES`` or :func:`set_max_state_bytes` to raise it): a size that fits the
machine can still be a typo (a window of ``2**24`` tokens per head on a four-token prompt asks
for gigabytes), and a state that large is refused before anything is allocated.
"""

from __future__ import annotations

import os

import torch

__all__ = ["DEFAULT_MAX_STATE_BYTES", "available_bytes", "check_allocation", "max_state_bytes", "set_max_state_bytes"]

DEFAULT_MAX_STATE_BYTES = 4 * 2**30
"""Most bytes one layer's LoLA state may hold unless the user raises it (4 GiB: a window of
4,096 tokens for 8 K/V heads of 128 dimensions in bfloat16 holds 16 MiB per row, so 256 rows)."""
_ENV = "LOLA_MAX_STATE_BYTES"
_limit: int | None = None  # set_max_state_bytes's value; None: the environment, else the default


def set_max_state_bytes(limit: int | None) -> None:
    """Set the most bytes one layer's LoLA state may hold (``None``: back to
    ``LOLA_MAX_STATE_BYTES`` or the default, :data:`DEFAULT_MAX_STATE_BYTES`).

    Raises:
        ValueError: ``limit`` is not a positive integer.
    """
    global _limit
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer number of bytes or None, got {limit!r}")
    _limit = limit


def max_state_bytes() -> int:
    """The most bytes one layer's LoLA state may hold: :func:`set_max_state_bytes`'s value, else
    the environment's ``LOLA_MAX_STATE_BYTES``, else :data:`DEFAULT_MAX_STATE_BYTES`.

    Raises:
        ValueError: ``LOLA_MAX_STATE_BYTES`` is set to something other than a positive integer.
    """
    if _limit is not None:
        return _limit
    text = os.environ.get(_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_STATE_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{_ENV} must be a positive integer number of bytes, got {text!r}")
    return value


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


def check_allocation(nbytes: int, device: torch.device, what: str, available: int | None = None, held: int | None = None) -> None:
    """Refuse to allocate ``nbytes`` on ``device`` if more than that is not free, or if the
    state it holds is over the user's limit (:func:`max_state_bytes`).

    Args:
        nbytes: what the allocation needs (the state and its working copies).
        device: where it goes.
        what: what is allocated and from which settings, for the message.
        available: bytes free (default: :func:`available_bytes`).
        held: bytes the state itself holds once allocated, checked against the limit (default:
            not checked; meta tensors hold nothing and are never checked).

    Raises:
        MemoryError: naming ``what``, the bytes needed and the bytes free or the limit.
    """
    device = torch.device(device)
    free = available_bytes(device) if available is None else available
    if free is not None and nbytes > free:
        raise MemoryError(f"{what} needs {nbytes / 2**30:.2f} GiB on {device}, but only {free / 2**30:.2f} GiB is free; lower those sizes or the batch")
    if held is not None and device.type != "meta":
        limit = max_state_bytes()
        if held > limit:
            raise MemoryError(
                f"{what} holds {held / 2**30:.2f} GiB, over the limit of {limit / 2**30:.2f} GiB per layer; "
                f"lower those sizes or the batch, or raise the limit ({_ENV} or lola.set_max_state_bytes)"
            )
