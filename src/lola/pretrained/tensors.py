"""Reading named tensors from a file: each name parsed, floats only, one tensor per name.

Feature-map folders and LoRA weights both hold tensors named by a pattern (a group such as a
layer or a projection, and a part within it). Both are read through :func:`group_tensors`,
so that neither casts integer or bool values nor lets a second copy of a tensor under another
prefix silently replace the first.
"""

from __future__ import annotations

import re

import torch

__all__ = ["group_tensors"]


def group_tensors(tensors: dict[str, torch.Tensor], pattern: re.Pattern, where: str, expected: str) -> dict[str, dict[str, torch.Tensor]]:
    """``{group: {part: tensor}}`` from ``pattern``'s two groups, searched in every name.

    Args:
        tensors: the tensors as read from a file.
        pattern: a regex with two groups, the group and the part (e.g. ``"0"`` and ``"window_factors"``).
        where: the file or collection, for messages.
        expected: what a name should look like, for the message on a name that does not.

    Raises:
        ValueError: a name the pattern does not match, a tensor that is not floating point, or
            two tensors for one group and part (names differing only in their prefix).
    """
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = pattern.search(key)
        if m is None:
            raise ValueError(f"{where}: {key!r} is not {expected}")
        if not tensor.is_floating_point():
            raise ValueError(f"{where}: tensor {key!r} is {tensor.dtype}, expected floating point (integer or bool values would be cast)")
        found = groups.setdefault(m.group(1), {})
        if m.group(2) in found:
            raise ValueError(f"{where}: two tensors for {m.group(1)} / {m.group(2)} (under different prefixes; {key!r} is the second): one would silently win")
        found[m.group(2)] = tensor
    return groups
