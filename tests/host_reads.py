"""Count the reads of tensor values back to the host (``bool(t)``, ``t.item()``, ``t.tolist()``,
``int(t)``, ``float(t)``, ``t.nonzero()``): on an accelerator each one waits for the device.

A CPU has nothing to wait for, so the count is the way a CPU test proves that a path would not
stall a GPU. Only reads made from lola's own code are counted (the caller's frame is in the
``lola`` package), not those of transformers or of the test.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
from typing import Iterator

import torch

import lola

LOLA_ROOT = os.path.dirname(lola.__file__)
METHODS = ("__bool__", "item", "tolist", "__int__", "__float__", "__index__", "nonzero")


@contextlib.contextmanager
def count_host_reads() -> Iterator[collections.Counter]:
    """Yields a Counter of ``"file:line"`` → reads made there from lola's code, for CPU tensors."""
    counter: collections.Counter = collections.Counter()
    saved = {name: getattr(torch.Tensor, name) for name in METHODS}

    def wrap(name):
        real = saved[name]

        def read(self, *args, **kwargs):
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(LOLA_ROOT):
                counter[f"{os.path.relpath(caller.f_code.co_filename, LOLA_ROOT)}:{caller.f_lineno}"] += 1
            return real(self, *args, **kwargs)

        return read

    try:
        for name in METHODS:
            setattr(torch.Tensor, name, wrap(name))
        yield counter
    finally:
        for name, real in saved.items():
            setattr(torch.Tensor, name, real)
