"""The adversarial pass's case list is well formed, and ``python -m tests.hostile.adversarial
--list`` lists it (the pass itself is a measurement, run by hand: see its README)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def test_the_cases_are_well_formed():
    from tests.hostile.adversarial.cases import BATCHES, CASES, MODULES, problems
    from tests.hostile.adversarial.harness import CLASSES, Expect

    assert BATCHES == (1, 2, 3) and set(MODULES) == set(CLASSES) and len(CLASSES) == 7
    assert problems() == []
    assert len(CASES) == sum(len(m.CASES) for m in MODULES.values())  # none left out
    assert len({c.id for c in CASES}) == len(CASES)
    for c in CASES:
        assert c.cls in CLASSES and c.batch in BATCHES, c
        assert callable(c.run) and isinstance(c.expect, Expect), c
        assert c.expect.kind in ("refuse", "accept", "either", "intact"), c
        assert c.expect.kind != "either" or c.expect.check is not None, c  # accepted only if proven right
    assert {c.batch for c in CASES} == set(BATCHES) and {c.cls for c in CASES} == set(CLASSES)


def test_the_pass_lists_every_case():
    from tests.hostile.adversarial.cases import CASES

    done = subprocess.run([sys.executable, "-m", "tests.hostile.adversarial", "--list"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()
    assert len(rows) == len(CASES)
    assert [row.split()[0] for row in rows] == [c.id for c in CASES]
