"""The adversarial cases, one module per input class; each case carries its class and its batch.

:data:`CASES` holds every case, batch 1 before batch 2 before batch 3 and, within a batch, in the
order of :data:`~tests.hostile.adversarial.harness.CLASSES`.
"""

from __future__ import annotations

from ..harness import CLASSES, Case
from . import attention, files, messages, numbers, refused, resume, state

MODULES = {"attention": attention, "state": state, "resume": resume, "files": files, "numbers": numbers, "refused": refused, "messages": messages}
BATCHES = (1, 2, 3)
CASES: list[Case] = [c for batch in BATCHES for cls in CLASSES for c in MODULES[cls].CASES if c.batch == batch]


def problems() -> list[str]:
    """What is wrong with the case modules: an id given twice, a case of another class than its
    module's, or of a batch not in :data:`BATCHES` (it would be left out of :data:`CASES`)."""
    found, seen = [], set()
    for cls, module in MODULES.items():
        for c in module.CASES:
            if c.id in seen:
                found.append(f"case {c.id!r}: the id is given twice")
            seen.add(c.id)
            if c.cls != cls:
                found.append(f"case {c.id!r}: class {c.cls!r}, in the module of class {cls!r}")
            if c.batch not in BATCHES:
                found.append(f"case {c.id!r}: batch {c.batch!r}, not one of {BATCHES}")
    return found
