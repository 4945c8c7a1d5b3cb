"""Value checks that never stall an accelerator.

A check of a tensor's values (finite inputs, scores that are not NaN) needs the answer on the
host. On the CPU reading it back costs nothing; on an accelerator it waits for every queued
kernel, once per layer and decoded token if the check sits on the decode path. There the
check is an asynchronous assert (``torch._assert_async``): the device stops the program at the
next synchronising call with the message, and the step never waits.
"""

from __future__ import annotations

import torch

__all__ = ["HOST_DEVICES", "reads_back", "require"]

HOST_DEVICES = frozenset({"cpu"})
"""Device types whose values a check may read back (no device synchronisation)."""


def reads_back(device: torch.device) -> bool:
    """Whether a check on ``device`` may read a value back to the host (see :data:`HOST_DEVICES`)."""
    return device.type in HOST_DEVICES


def require(condition: torch.Tensor, message: str) -> bool:
    """Check a one-element bool tensor without stalling an accelerator.

    Returns:
        On a host device, the condition's value (the caller raises its own, more precise error
        when it is false); on an accelerator ``True`` after queueing an asynchronous assert
        with ``message``.
    """
    if reads_back(condition.device):
        return bool(condition)
    torch._assert_async(condition, message)
    return True
